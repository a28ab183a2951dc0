"""Large message buffers between processes of one host travel through shared memory.

Sending 64 MiB through a Unix socket costs two kernel copies plus many small reads on each
side. Instead the sender writes a large out-of-band buffer once into a file in ``/dev/shm``
and sends its name; the receiver maps it copy-on-write (so the array it unpickles is
writable and private). One copy in total, none on the receiving side.

Most of the cost of a fresh file is not the copy but the kernel allocating and zeroing its
pages, so each sender keeps a ``SendPool`` of files it lends out and gets back: the receiver
maps a lent file, and when the last object using that mapping is gone it tells the sender,
which then reuses the file, its pages already in place. Files beyond the pool's budget are
one-shot: the receiver unlinks them at once.

Names carry the job's tag, so whatever a crashed process left behind can be swept (``sweep``;
``job_files`` decides when a job is over). Where ``/dev/shm`` is missing or full, senders use
the socket: a file's space is reserved (``posix_fallocate``) before a byte goes into it, and a
receiver maps only files whose pages all exist, so a full ``/dev/shm`` never raises SIGBUS,
which would kill the process touching the missing page.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import mmap
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from monarch._src.wire.frame import FrameTooLargeError
from monarch._src.wire.protocol import (
    FILE_NAMES,
    SHM_AS_BYTES,
    SHM_LENDER,
    SHM_LENT,
    SHM_MOVED,
    shm_give_back,
)

if TYPE_CHECKING:
    from monarch._src.runtime.runtime import Runtime

T = TypeVar("T")

logger = logging.getLogger("monarch.runtime")

SHM_DIR = "/dev/shm"
#: Buffers at least this large go through shared memory.
THRESHOLD = 1 << 20
_available = os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)
_warned = False


def available() -> bool:
    return _available


def _fall_back(reason: str) -> None:
    """Large buffers of this process go through the socket this time; say so once."""
    global _warned
    if not _warned:
        _warned = True
        logger.warning(
            "%s: large messages of this process go through the socket instead (slower).\n"
            "HINT: give %s more space (docker run --shm-size=...), or send smaller buffers.",
            reason,
            SHM_DIR,
        )


def disable(reason: str) -> None:
    """Stop using ``/dev/shm`` in this process (it is unusable)."""
    global _available
    _available = False
    _fall_back(reason)


def _new_name(job_tag: str) -> str:
    return f"monarch-{job_tag}-{os.urandom(8).hex()}"


def _names_in_shm(prefix: str) -> list[str]:
    try:
        return [name for name in os.listdir(SHM_DIR) if name.startswith(prefix)]
    except OSError:
        return []


def lock_path(job_tag: str) -> str:
    """The job's lock file (see ``job_files``); not a buffer, so ``sweep`` leaves it."""
    return os.path.join(SHM_DIR, f"monarch-{job_tag}.lock")


def files_by_job() -> dict[str, list[str]]:
    """This user's buffer files in ``/dev/shm`` by job tag; a job with only a lock file left
    has an empty list. Files of other users are not listed: they are never ours to remove."""
    jobs: dict[str, list[str]] = {}
    uid = os.geteuid()
    for name in _names_in_shm("monarch-"):
        path = os.path.join(SHM_DIR, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
            continue
        if name.endswith(".lock"):
            jobs.setdefault(name[len("monarch-") : -len(".lock")], [])
        elif name.count("-") >= 2:
            jobs.setdefault(name[len("monarch-") :].rsplit("-", 1)[0], []).append(path)
    return jobs


def _create(job_tag: str, size: int, fill: Callable[[int], T]) -> tuple[str, T] | None:
    """A new file of this job in ``/dev/shm`` with ``size`` bytes reserved, filled by
    ``fill(fd)``; (name, what ``fill`` returned), or None where ``/dev/shm`` is unusable or
    full (senders then use the socket)."""
    name = _new_name(job_tag)
    path = os.path.join(SHM_DIR, name)
    try:
        free = os.statvfs(SHM_DIR)
        if free.f_bavail * free.f_frsize < size:  # not worth a try, which holds what is left a while
            _fall_back(f"{SHM_DIR} has no room for {size} bytes ({free.f_bavail * free.f_frsize} free)")
            return None
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as e:
        disable(f"cannot create files in {SHM_DIR} ({e})")
        return None
    try:
        os.posix_fallocate(fd, 0, size)  # writes into a page the tmpfs lacks raise SIGBUS
        return name, fill(fd)
    except OSError as e:
        os.unlink(path)
        _fall_back(f"{SHM_DIR} has no room for {size} bytes ({e})")
        return None
    finally:
        os.close(fd)


def _write_all(fd: int, buffer: memoryview) -> None:
    view = memoryview(buffer).cast("B")
    while view.nbytes:
        view = view[os.write(fd, view) :]


def export(job_tag: str, buffer: memoryview) -> bytes | None:
    """Copy ``buffer`` into a new shared-memory file; its name, or None to use the socket."""
    created = _create(job_tag, memoryview(buffer).nbytes, lambda fd: _write_all(fd, buffer))
    return created[0].encode() if created is not None else None


def _path_of(name: bytes) -> str:
    text = name.decode()
    if "/" in text or not text.startswith("monarch-"):
        raise ValueError(f"not a monarch shared-memory buffer name: {text!r}")
    return os.path.join(SHM_DIR, text)


def _read_exactly(fd: int, size: int, path: str) -> bytes:
    data = os.pread(fd, size, 0)
    while len(data) < size:  # very large files may need more than one read
        chunk = os.pread(fd, size - len(data), len(data))
        if not chunk:
            raise OSError(f"shared-memory buffer {path} is truncated")
        data += chunk
    return data


def _map(fd: int, size: int, path: str) -> mmap.mmap | bytearray:
    """The first ``size`` bytes of the file, mapped copy-on-write (or copied, see below).

    Touching a page the file lacks (beyond its end, or a hole when the tmpfs is full) would
    raise SIGBUS and kill this process; such a file (truncated, or sparse: a peer that did not
    reserve its space) is checked for first, and a sparse one is read instead (holes read as
    zeros without allocating).
    """
    st = os.fstat(fd)
    if st.st_size < size:
        raise OSError(f"shared-memory buffer {path} has {st.st_size} bytes, not {size}")
    if st.st_blocks * 512 < size:
        return bytearray(_read_exactly(fd, size, path))
    return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def import_(name: bytes, as_bytes: bool = False) -> memoryview | bytes:
    """Map a buffer a peer exported (copy-on-write) and remove its name.

    ``as_bytes`` reads it into a ``bytes`` object instead, for data that must become ``bytes``
    anyway (one kernel copy, no page faults on a mapping).
    """
    path = _path_of(name)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.unlink(path)
        if as_bytes:
            return _read_exactly(fd, size, path)
        if size == 0:
            return memoryview(b"")
        return memoryview(_map(fd, size, path))
    finally:
        os.close(fd)


def borrow(name: bytes, size: int, as_bytes: bool, give_back: Callable[[], None]) -> memoryview | bytes:
    """Use the first ``size`` bytes of a file a peer's ``SendPool`` lent us.

    ``give_back`` runs once nothing here uses the file any more: at once for ``as_bytes``
    (the data is copied out), else when the copy-on-write mapping is garbage collected; the
    mapping object is what every view of the data keeps alive, however it was derived.
    """
    path = _path_of(name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        give_back()
        raise
    try:
        if as_bytes or size == 0:
            give_back()
            return _read_exactly(fd, size, path) if size else b""
        data = _map(fd, size, path)
    except BaseException:
        if not as_bytes:
            give_back()
        raise
    finally:
        os.close(fd)
    if isinstance(data, bytearray):  # a copy: the file is no longer needed
        give_back()
    else:
        weakref.finalize(data, give_back).atexit = False
    return memoryview(data)


class _Slot:
    __slots__ = ("name", "capacity", "mapping", "borrower", "freed_at")

    def __init__(self, name: str, capacity: int, mapping: mmap.mmap) -> None:
        self.name = name
        self.capacity = capacity
        self.mapping = mapping
        self.borrower: str | None = None
        self.freed_at = 0.0


class SendPool:
    """Shared-memory files one process lends to receivers and reuses once they give them back.

    Thread-safe: any thread may send. ``budget`` bounds the bytes of files kept; a buffer
    that does not fit (every file lent, or larger than the budget) gets ``None`` and goes as
    a one-shot file.
    """

    #: File sizes are rounded up to this, so similar payloads share files.
    GRANULE = 1 << 20

    def __init__(self, job_tag: str, budget: int) -> None:
        self._job_tag = job_tag
        self._budget = budget
        self._lock = threading.Lock()
        self._free: list[_Slot] = []
        self._lent: dict[str, _Slot] = {}
        self._bytes = 0
        self._closed = False

    def lend(self, buffer: memoryview, borrower: str) -> bytes | None:
        """Copy ``buffer`` into a pooled file lent to ``borrower``; its name, or None."""
        view = memoryview(buffer).cast("B")
        n = view.nbytes
        slot = self._take(n, borrower)
        if slot is None:
            return None
        try:
            slot.mapping[:n] = view
        except BaseException:
            self.give_back([slot.name])
            raise
        return slot.name.encode()

    def _take(self, n: int, borrower: str) -> _Slot | None:
        with self._lock:
            if self._closed:
                return None
            fits = [s for s in self._free if s.capacity >= n]
            if fits:
                slot = min(fits, key=lambda s: s.capacity)
                self._free.remove(slot)
            else:
                capacity = -(-n // self.GRANULE) * self.GRANULE
                if capacity > self._budget:
                    return None
                while self._bytes + capacity > self._budget and self._free:
                    self._discard(self._free.pop(0))
                if self._bytes + capacity > self._budget:
                    return None
                created = self._new_slot(capacity)
                if created is None:
                    return None
                slot = created
            slot.borrower = borrower
            self._lent[slot.name] = slot
            return slot

    def _new_slot(self, capacity: int) -> _Slot | None:
        created = _create(self._job_tag, capacity, lambda fd: mmap.mmap(fd, capacity))
        if created is None:
            return None
        self._bytes += capacity
        return _Slot(created[0], capacity, created[1])

    def _discard(self, slot: _Slot) -> None:
        self._bytes -= slot.capacity
        try:
            os.unlink(os.path.join(SHM_DIR, slot.name))
        except OSError:
            pass
        slot.mapping.close()

    def give_back(self, names: list[str]) -> None:
        """The borrowers of ``names`` no longer use them."""
        with self._lock:
            for name in names:
                slot = self._lent.pop(name, None)
                if slot is None:
                    continue
                slot.borrower = None
                slot.freed_at = time.monotonic()
                self._free.append(slot)

    def trim(self, idle_s: float) -> bool:
        """Remove the files nobody borrowed for ``idle_s`` seconds (their memory goes back to
        the system); whether free files remain, to trim later."""
        cutoff = time.monotonic() - idle_s
        with self._lock:
            keep = [slot for slot in self._free if slot.freed_at > cutoff]
            for slot in self._free:
                if slot.freed_at <= cutoff:
                    self._discard(slot)
            self._free = keep
            return bool(keep)

    def reclaim(self, borrower: str) -> None:
        """``borrower`` is gone: the files it held are removed at once, their memory back to the
        system (a restarted worker would otherwise pin its predecessor's until a trim)."""
        with self._lock:
            for name, slot in list(self._lent.items()):
                if slot.borrower == borrower:
                    del self._lent[name]
                    self._discard(slot)

    def close(self) -> None:
        """Remove every file (mappings that receivers hold stay valid until they unmap)."""
        with self._lock:
            self._closed = True
            for slot in self._free + list(self._lent.values()):
                self._discard(slot)
            self._free.clear()
            self._lent.clear()


class SentFiles:
    """The one-shot files this process sent to each receiver that it may not have taken yet.

    A receiver removes a one-shot file as it maps it; one that is lost first (killed, or
    unreachable) never will, and the file would hold its size of memory until the job ends.
    Thread-safe. Names the receivers took are forgotten from time to time (their files are
    gone), so the record stays the size of what is in flight."""

    #: Names recorded for one receiver before those it took are first forgotten.
    FIRST_CHECK = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_receiver: dict[str, list[str]] = {}
        #: Per receiver: how many names it may have before the next look for taken ones.
        self._check_at: dict[str, int] = {}

    def add(self, receiver: str, name: bytes) -> None:
        with self._lock:
            names = self._by_receiver.setdefault(receiver, [])
            names.append(name.decode())
            if len(names) >= self._check_at.get(receiver, self.FIRST_CHECK):
                names[:] = [n for n in names if os.path.lexists(os.path.join(SHM_DIR, n))]
                self._check_at[receiver] = max(self.FIRST_CHECK, 2 * len(names))

    def remove_sent_to(self, receiver: str) -> None:
        """``receiver`` is gone: remove the files it did not take."""
        with self._lock:
            names = self._by_receiver.pop(receiver, [])
            self._check_at.pop(receiver, None)
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, name))


class Lending:
    """The shared-memory half of one runtime's frames: large buffers of frames it sends go out
    as files (lent from its ``SendPool`` where they fit), files in frames it receives are
    mapped, and lent files it is done with go back to their lender (``SHM_GIVE_BACK_KIND``).

    The header keys it reads and writes are the ``SHM_*`` keys of ``wire.protocol``.
    """

    def __init__(self, rt: Runtime, pool_bytes: int, pool_idle_s: float) -> None:
        self._rt = rt
        self._pool = SendPool(rt.job_tag, pool_bytes)
        self._sent = SentFiles()
        self._pool_idle_s = pool_idle_s
        #: Lent files this process is done with, per lender, not yet told (see _give_back).
        self.given_back: dict[str, list[str]] = {}
        self._given_back_lock = threading.Lock()
        self._trim_scheduled = False

    def export(self, address: str, header: dict, bodies: list) -> list:
        """Move large out-of-band buffers of a frame to ``address`` to shared memory (same host).

        ``SHM_MOVED`` lists the bodies that became file names; ``SHM_LENT`` those of them lent
        from this process's pool, as [index, size] pairs, and ``SHM_LENDER`` says where to give
        them back.
        """
        sizes = [memoryview(b).nbytes for b in bodies]
        if max(sizes[1:]) < THRESHOLD:
            return bodies
        limit = self._rt.max_frame_bytes
        if sum(sizes) > limit:  # the limit applies to the message, wherever it travels
            raise FrameTooLargeError(sum(sizes), limit, "sending")
        bodies = list(bodies)
        moved, as_bytes, lent = [], [], []
        for i in range(1, len(bodies)):
            if sizes[i] >= THRESHOLD:
                was_bytes = type(memoryview(bodies[i]).obj) is bytes
                name = self._pool.lend(bodies[i], address)
                if name is not None:
                    lent.append([i, sizes[i]])
                else:
                    name = export(self._rt.job_tag, bodies[i])
                    if name is not None:
                        self._sent.add(address, name)
                if name is not None:
                    bodies[i] = name
                    moved.append(i)
                    if was_bytes:  # rebuilt as bytes: read it straight into a bytes object
                        as_bytes.append(i)
        if moved:
            header[SHM_MOVED] = moved
        if as_bytes:
            header[SHM_AS_BYTES] = as_bytes
        if lent:
            header[SHM_LENT] = lent
            header[SHM_LENDER] = self._rt.address
        return bodies

    def receive(self, header: dict, bodies: list) -> None:
        """Replace the file names among a received frame's bodies by the files' contents.
        Raises OSError, ValueError, TypeError or IndexError where a file is unusable."""
        moved = header.get(SHM_MOVED)
        if not moved:
            return
        as_bytes = header.get(SHM_AS_BYTES) or ()
        lent = dict(header.get(SHM_LENT) or ())
        lender = header.get(SHM_LENDER)
        if lent and not isinstance(lender, str):
            raise ValueError("lent shared-memory buffers without a lender address")
        self._check_receive_limit(moved, lent, lender, bodies)
        for i in moved:
            name = bytes(bodies[i])
            if i in lent:
                give_back = functools.partial(self._give_back, str(lender), name.decode())
                bodies[i] = borrow(name, lent[i], i in as_bytes, give_back)
            else:
                bodies[i] = import_(name, as_bytes=i in as_bytes)

    def _check_receive_limit(self, moved: list, lent: dict, lender: object, bodies: list) -> None:
        """The receiver's frame limit holds for bodies in files as for bodies on the socket: an
        oversized message is refused before anything is mapped, and its files are released
        (lent ones given back, exported ones removed) so that refusing it leaks nothing."""
        limit = self._rt.max_frame_bytes
        in_files = set(moved)
        total = sum(memoryview(b).nbytes for i, b in enumerate(bodies) if i not in in_files)
        for i in moved:
            total += lent[i] if i in lent else os.stat(_path_of(bytes(bodies[i]))).st_size
        if total <= limit:
            return
        for i in moved:
            name = bytes(bodies[i])
            if i in lent:
                self._give_back(str(lender), name.decode())
            else:
                with contextlib.suppress(OSError):
                    os.unlink(_path_of(name))
        raise FrameTooLargeError(total, limit, "receiving")

    def given_back_to_us(self, header: dict, bodies: list) -> None:
        """(loop thread) A borrower is done with files we lent; unused ones are trimmed later."""
        self._pool.give_back(header[FILE_NAMES])
        if not self._trim_scheduled:
            self._trim_scheduled = True
            self._rt.loop.call_later(self._pool_idle_s, self._trim_pool)

    def _trim_pool(self) -> None:
        self._trim_scheduled = self._pool.trim(self._pool_idle_s)
        if self._trim_scheduled:
            self._rt.loop.call_later(self._pool_idle_s, self._trim_pool)

    def _give_back(self, lender: str, name: str) -> None:
        """Queue the return of a lent file. It may run in any thread, even inside ``send``
        (the last reference to a mapping can go anywhere), so it only queues; the queue goes
        out before the next frame this process sends, which keeps "given back" ahead of the
        reply that follows it, and from the loop soon after in any case."""
        with self._given_back_lock:
            self.given_back.setdefault(lender, []).append(name)
        if not self._rt.closed:
            try:
                self._rt.loop_thread.call_soon(self.flush_given_back)
            except RuntimeError:  # the loop is closed: this process is exiting
                pass

    def flush_given_back(self) -> None:
        """Tell each lender which of its files this process is done with."""
        with self._given_back_lock:
            pending, self.given_back = self.given_back, {}
        for lender, names in pending.items():
            try:
                self._rt.send(lender, shm_give_back(names), [b""])
            except Exception as e:  # the lender is gone, or we are: nothing to give back to
                logger.debug("could not give shared-memory files back to %s: %s", lender, e)

    def reclaim(self, borrower: str) -> None:
        """``borrower`` is gone: the files lent to it (``SendPool.reclaim``) and the one-shot
        files it did not take (``SentFiles``) are removed."""
        self._pool.reclaim(borrower)
        self._sent.remove_sent_to(borrower)

    def close(self) -> None:
        self._pool.close()


def sweep(job_tag: str) -> None:
    """Remove buffers of this job that no receiver picked up (client shutdown)."""
    for name in _names_in_shm(f"monarch-{job_tag}-"):
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass
