"""Helpers for the fault tests: raw connections to a monarch process, its log, its memory."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import hmac
import os
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import psutil

from monarch.actor import Actor, endpoint, this_host

CHALLENGE_BYTES = 4 + 1 + 32

#: A client that logs a record in a worker and in itself and prints both log files (worker's
#: first), for the tests of where framework log files go.
LOG_FILES_CLIENT = """
import logging, os
from monarch.actor import Actor, endpoint, this_host
from monarch._src.runtime import framework_log

class Where(Actor):
    @endpoint
    def log_file(self):
        logging.getLogger("monarch.test").warning("a worker's record")
        return framework_log.log_file()

pm = this_host().spawn_procs(per_host={"gpus": 1})
print(pm.spawn("where", Where).log_file.call_one().get(timeout=30))
logging.getLogger("monarch.test").warning("the client's record")
print(framework_log.log_file())
pm.stop().get(timeout=10)
"""


class Probe(Actor):
    """Tells where its process is; ``ping`` answers what it is sent."""

    @endpoint
    async def where(self) -> tuple[int, str]:
        from monarch._src.actor.process_state import runtime

        return os.getpid(), runtime().address

    @endpoint
    async def ping(self, x: object) -> object:
        return x

    @endpoint
    async def length(self, data: bytes | str) -> int:
        return len(data)

    @endpoint
    async def note(self, line: str) -> None:
        """Write ``line`` to this process's framework log (which opens its file)."""
        import logging

        logging.getLogger("monarch.faults").warning("%s", line)


class Relay(Probe):
    """Calls another mesh from its own process."""

    @endpoint
    async def forward(self, target: Any, x: object) -> object:
        return await target.ping.call_one(x)


@contextlib.contextmanager
def probe_worker(
    env: dict[str, str] | None = None, cls: type[Probe] = Probe, name: str = "probe"
) -> Iterator[tuple[Any, int, str]]:
    """A 1-process mesh running a ``Probe`` (or a subclass, as ``name``): yields (probe, its
    pid, its address); stopped after."""
    pm = this_host().spawn_procs(per_host={"gpus": 1}, env=env)
    try:
        probe = pm.spawn(name, cls)
        pid, address = probe.where.call_one().get(timeout=30)
        yield probe, pid, address
    finally:
        pm.stop().get(timeout=10)


def socket_path(address: str) -> str:
    assert address.startswith("unix:")
    return address[len("unix:") :]


def authenticated_connection(
    address: str, timeout: float = 30.0, nonce: bytes | None = None
) -> socket.socket:
    """A connection that passed the handshake with this job's secret (the client's); ``nonce``:
    the one it chooses there (which names the connection in a later hello), else a random one."""
    from monarch._src.actor.process_state import runtime

    secret = runtime().secret
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(socket_path(address))
            break
        except BlockingIOError:  # the listen backlog is full for now
            s.close()
            if time.monotonic() > deadline:
                raise
    with s.makefile("rb") as incoming:  # the server sends nothing after its proof
        challenge = incoming.read(CHALLENGE_BYTES)
        nonce_s, nonce_c = challenge[5:], nonce or os.urandom(32)
        s.sendall(nonce_c + hmac.digest(secret, b"C" + nonce_s + nonce_c, hashlib.sha256))
        if len(incoming.read(32)) != 32:  # the server's proof: we are in
            raise ConnectionError(f"{address} did not accept the handshake")
    return s


def on_loop(fn: Any) -> Any:
    """``fn()`` run on this process's runtime loop (whose tables it may look at or change)."""
    from monarch._src.actor.process_state import runtime

    async def run() -> Any:
        return fn()

    return runtime().loop_thread.run_sync(run(), timeout=10)


def frame_head(header: dict) -> bytes:
    """Prefix and header of a frame (its bodies, of the lengths in header["b"], follow)."""
    head = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<I", len(head)) + head


def unsent_bytes(sock: socket.socket) -> int:
    """Bytes written on ``sock`` that the peer has not read yet (SIOCOUTQ)."""
    import fcntl
    import termios

    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]


def rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def worker_log(pid: int) -> str:
    """The framework log of worker ``pid`` (this job's log directory)."""
    from monarch._src.runtime import framework_log

    files = glob.glob(os.path.join(framework_log.log_dir(), f"*-{pid}.log"))
    if not files:
        return ""
    with open(files[0]) as f:
        return f.read()
