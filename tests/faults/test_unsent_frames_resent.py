"""Messages still queued in the client when its connection to a worker fails are not lost.

The worker is frozen (SIGSTOP), so its socket buffer (made large) fills with a burst of
broadcasts and the rest of the burst, and the calls after it, wait in the client's queue: never
handed to the kernel. The client's connection is then shut down from outside (found through ``ss`` and
/proc, as a write error or ``ss -K`` would end it). If the worker lives on, the queued messages
go first on the new connection, in order, exactly once, and after what the old connection still
held (the worker reads that while the new one comes in): every call returns its value and every
broadcast runs once, in order, with no failure reported. If the worker is killed instead, the
calls fail with its death, the mesh's owner gets a ``MeshFailure``, the client logs the
messages it never sent, and the shared-memory files lent with them are removed; nothing waits
forever.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fault_helpers import Probe, authenticated_connection, probe_worker, socket_path, worker_log
from helpers import freeze, wait_until

from monarch._src.wire import payload
from monarch._src.wire.frame import encode_frame
from monarch._src.wire.protocol import message, peer_hello
from monarch.actor import MeshFailure, SupervisionError, endpoint

pytestmark = pytest.mark.timeout(120)

PAD = b"x" * 1024
#: The client's socket buffer, made as large as the system allows (as TCP's autotuning does):
#: the worker, resumed, needs many reads to drain it, while the new connection comes in.
with open("/proc/sys/net/core/wmem_max") as f:
    SNDBUF = int(f.read())
#: Broadcasts in the burst: several times what the socket buffer takes (the kernel doubles it).
BURST = 4 * 2 * SNDBUF // len(PAD)
CALLS = 20
#: The address a raw peer names in its hello (nothing is sent back to it).
FAKE_PEER = "unix:/nonexistent/raw-peer.sock"
#: The nonce of the raw peer's old connection's handshake: its new hello names it.
OLD = os.urandom(32)
MIB = 1 << 20
#: Calls with an array lent from shared memory.
LENT = 4


class Recorder(Probe):
    """Records the sequence numbers of the broadcasts it receives, in the order they run."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    async def record(self, seq: int, pad: bytes) -> None:
        self.seen.append(seq)

    @endpoint
    async def recorded(self) -> list[int]:
        return self.seen


def job_shm_bytes() -> int:
    """Bytes of this client's shared-memory files, as anyone can see them in /dev/shm."""
    from monarch._src.actor.process_state import runtime

    total = 0
    for path in glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*"):
        with contextlib.suppress(FileNotFoundError):
            total += os.stat(path).st_size
    return total


def _our_sockets() -> dict[int, int]:
    """This process's sockets: inode -> descriptor."""
    sockets = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            sockets[int(link[len("socket:[") : -1])] = int(fd)
    return sockets


def connections_to(address: str) -> list[tuple[int, int]]:
    """This process's connections to the Unix socket ``address``: (descriptor, bytes the peer
    has not read yet), from the kernel's table (``ss``) and /proc."""
    path = socket_path(address)
    ours = _our_sockets()
    out = subprocess.run(["ss", "-xnH"], capture_output=True, text=True, timeout=10, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        # Netid State Recv-Q Send-Q Local-path Local-inode Peer-path Peer-inode: the worker's
        # end of a connection accepted on its listening path, whose peer end is ours.
        if len(fields) == 8 and fields[4] == path and int(fields[7]) in ours:
            found.append((ours[int(fields[7])], int(fields[2])))
    return found


def pending_at(address: str) -> int:
    """Connections waiting in the backlog of the Unix socket listening at ``address``."""
    out = subprocess.run(["ss", "-xlnH"], capture_output=True, text=True, timeout=10, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[4] == socket_path(address):
            return int(fields[2])
    return 0


def shut_down(fd: int) -> None:
    """End the connection on descriptor ``fd`` of this process, as a write error would."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.close()


def fill_while_frozen(recorder: Any, pid: int, address: str) -> tuple[int, list[Any]]:
    """Freeze the worker, send it a burst of broadcasts and then calls, most of them left in
    the client's queue; returns the descriptor of the connection and the calls."""
    assert recorder.ping.call_one("connected").get(timeout=30) == "connected"
    ((fd, _),) = connections_to(address)
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
    freeze(pid)
    for seq in range(BURST):
        recorder.record.broadcast(seq, PAD)
    calls = [recorder.ping.call_one(i) for i in range(CALLS)]
    ((_, unread),) = wait_until(
        lambda: [c for c in connections_to(address) if c[1] > 0], 10, "the worker's socket buffer to fill"
    )
    assert unread < BURST * len(PAD) // 2, "the socket took most of the burst: nothing would be queued"
    return fd, calls


@pytest.fixture
def worker() -> Iterator[tuple[Any, int, str]]:
    """A 1-process mesh running a ``Recorder``: (the mesh, its pid, its address)."""
    with probe_worker(cls=Recorder, name="recorder") as found:
        yield found


def test_queued_messages_go_first_on_the_new_connection(
    worker: tuple[Any, int, str], faults: list[MeshFailure]
) -> None:
    recorder, pid, address = worker
    try:
        fd, calls = fill_while_frozen(recorder, pid, address)
        shut_down(fd)
        # Sent while the client reconnects (to a frozen worker): after the queued ones.
        for seq in range(BURST, BURST + 100):
            recorder.record.broadcast(seq, PAD)
        later = recorder.ping.call_one("later")
        wait_until(lambda: pending_at(address), 10, "the client's new connection, pending at the worker")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert [c.get(timeout=30) for c in calls] == list(range(CALLS))
    assert later.get(timeout=30) == "later"
    seen = recorder.recorded.call_one().get(timeout=30)
    assert seen == list(range(BURST + 100)), (len(seen), [s for i, s in enumerate(seen) if s != i][:5])
    assert recorder.ping.call_one("after").get(timeout=10) == "after"
    assert faults == []


def test_queued_messages_to_a_killed_worker_fail_their_calls_and_reach_the_owner(
    worker: tuple[Any, int, str], faults: list[MeshFailure]
) -> None:
    recorder, pid, address = worker
    try:
        _, calls = fill_while_frozen(recorder, pid, address)
        # Queued too, with arrays lent from this process's shared memory to the worker.
        calls += [recorder.length.call_one(np.zeros(MIB // 8)) for _ in range(LENT)]
        lent = job_shm_bytes()
        assert lent >= LENT * MIB
    finally:
        os.kill(pid, signal.SIGKILL)
    for call in calls:
        with pytest.raises(SupervisionError, match="failed"):
            call.get(timeout=30)
    failure = wait_until(
        lambda: next((f for f in list(faults) if f.mesh_name == "recorder"), None),
        30,
        "the owner's MeshFailure",
    )
    assert "recorder" in failure.report(), failure.report()
    # The messages that had no one left to tell (the broadcasts) are logged, not dropped.
    wait_until(
        lambda: f"messages to {address} were never sent" in worker_log(os.getpid()),
        10,
        "the client's log line",
    )
    wait_until(lambda: job_shm_bytes() <= lent - LENT * MIB, 10, "the files lent with unsent messages to go")


def test_a_new_connection_waits_for_what_the_old_one_still_carries(
    worker: tuple[Any, int, str], faults: list[MeshFailure]
) -> None:
    """A peer (this test, on raw connections) reconnects while its old connection still has
    frames on the way: the new connection's frames run after them, as its hello says how many
    the old one carried."""
    recorder, _, address = worker
    ref = recorder._ref

    def broadcasts(seqs: range) -> bytes:
        return b"".join(
            bytes(buffer)
            for seq in seqs
            for buffer in encode_frame(
                message(ref.key, "record", None, 0, ref.wire_extent), payload.dumps(((seq, PAD), {})), 1 << 30
            )
        )

    def hello(previous: tuple[int, int, list, list, int | None] | None) -> bytes:
        """Its hello; ``previous``: what it wrote on the old connection."""
        header = peer_hello(FAKE_PEER, previous, 0, OLD)
        return b"".join(bytes(b) for b in encode_frame(header, [], 1 << 30))

    def recorded(n: int) -> list[int]:
        def enough() -> list[int] | None:
            seen = recorder.recorded.call_one().get(timeout=10)
            return seen if len(seen) >= n else None

        return wait_until(enough, 30, f"{n} broadcasts to run")

    with authenticated_connection(address, nonce=OLD) as old, authenticated_connection(address) as new:
        old.sendall(hello(None) + broadcasts(range(100)))
        recorded(100)  # the old connection is the peer's, as its hello said
        new.sendall(hello((200, 0, [], [], None)) + broadcasts(range(200, 300)))
        old.sendall(broadcasts(range(100, 200)))  # still on the way when the new one came
        assert recorded(300) == list(range(300))
    assert faults == []
