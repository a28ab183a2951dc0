"""Large message buffers between processes of one host travel through shared memory.

Sending 64 MiB through a Unix socket costs two kernel copies plus many small reads on each
side. Instead the sender writes a large out-of-band buffer once into a file in ``/dev/shm``
and sends its name; the receiver maps it copy-on-write (so the array it unpickles is
writable and private) and unlinks the name at once. One copy in total, none on the
receiving side.

Names carry the job's tag, so the client can sweep whatever a crashed receiver never
picked up (``sweep``). Where ``/dev/shm`` is missing or full, senders use the socket.
"""

from __future__ import annotations

import glob
import mmap
import os
import secrets
from typing import Callable

SHM_DIR = "/dev/shm"
#: Buffers at least this large go through shared memory.
THRESHOLD = 1 << 20
_available = os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def available() -> bool:
    return _available


def export(job_tag: str, buffer: memoryview) -> bytes | None:
    """Copy ``buffer`` into a new shared-memory file; its name, or None to use the socket."""
    global _available
    name = f"monarch-{job_tag}-{secrets.token_hex(8)}"
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        _available = False
        return None
    try:
        view = memoryview(buffer).cast("B")
        while view.nbytes:
            n = os.write(fd, view)
            view = view[n:]
    except OSError:  # e.g. /dev/shm is full: fall back to the socket
        os.close(fd)
        os.unlink(path)
        return None
    os.close(fd)
    return name.encode()


def import_(name: bytes, as_bytes: bool = False) -> memoryview | bytes:
    """Map a buffer a peer exported (copy-on-write) and remove its name.

    ``as_bytes`` reads it into a ``bytes`` object instead, for data that must become ``bytes``
    anyway (one kernel copy, no page faults on a mapping).
    """
    text = name.decode()
    if "/" in text or not text.startswith("monarch-"):
        raise ValueError(f"not a monarch shared-memory buffer name: {text!r}")
    path = os.path.join(SHM_DIR, text)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.unlink(path)
        if as_bytes:
            data = os.read(fd, size)
            while len(data) < size:  # very large files may need more than one read
                chunk = os.read(fd, size - len(data))
                if not chunk:
                    raise OSError(f"shared-memory buffer {text} is truncated")
                data += chunk
            return data
        if size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))
    finally:
        os.close(fd)


def sweep_orphans(job_exists: Callable[[str], bool]) -> None:
    """Remove buffers of jobs that no longer exist (their receivers died before reading).

    Only buffers older than a minute: a live job elsewhere (another TMPDIR) reads its own
    within milliseconds.
    """
    import time

    cutoff = time.time() - 60
    for path in glob.glob(os.path.join(SHM_DIR, "monarch-*-*")):
        tag = os.path.basename(path)[len("monarch-") :].rsplit("-", 1)[0]
        try:
            if not job_exists(tag) and os.stat(path).st_mtime < cutoff:
                os.unlink(path)
        except OSError:
            pass


def sweep(job_tag: str) -> None:
    """Remove buffers of this job that no receiver picked up (client shutdown)."""
    for path in glob.glob(os.path.join(SHM_DIR, f"monarch-{job_tag}-*")):
        try:
            os.unlink(path)
        except OSError:
            pass
