"""A TCP connection reset from outside (``ss -K``) with messages still queued in the client:
they go first on the new connection, and nothing is run twice.

The proc is frozen (SIGSTOP) while the client sends it a burst of broadcasts larger than both
sockets' buffers, then calls: the calls, and the burst's tail, are queued in the client when
the connection is reset. Once the proc resumes, every call returns its value (none fails as
"may or may not have run"), and the broadcasts it runs come in order, without duplicates,
ending with every queued one. The reset discards what the client's kernel had not sent yet: the proc
reports the broadcast it got in part to the mesh's owner, and those behind it in the kernel
are lost with the connection, as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import freeze, wait_until
from tcp_helpers import Where, tcp_procs
from test_tcp_peer_loss import kill_connections_to

import monarch.actor
from monarch._src.transport.address import TcpAddress, parse
from monarch.actor import MeshFailure, endpoint

PAD = b"x" * 1024
#: Broadcasts in the burst: several times what the sockets' buffers take from a frozen reader
#: (checked below).
BURST = 16384
CALLS = 20


class Recorder(Where):
    """Writes the sequence numbers of the broadcasts it runs to a file, one a line, in order."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)  # open while the actor lives

    @endpoint
    async def record(self, seq: int, pad: bytes) -> None:
        self.file.write(f"{seq}\n")


def in_kernel(address: str) -> tuple[int, int]:
    """Bytes of the connections to the proc at ``address`` in the kernel (``ss``): waiting in
    the proc's receive queues, and in the senders' send queues."""
    parsed = parse(address)
    assert isinstance(parsed, TcpAddress)
    port = f":{parsed.port}"

    def queues(*match: str) -> list[list[str]]:
        command = ["ss", "-tnH", *match]
        out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout
        return [line.split() for line in out.splitlines() if line.split()]

    received = sum(int(f[1]) for f in queues("src", parsed.host, "sport", "=", port))
    unsent = sum(int(f[2]) for f in queues("dst", parsed.host, "dport", "=", port))
    return received, unsent


@pytest.mark.timeout(120)
def test_messages_queued_when_a_tcp_connection_is_reset_go_first_on_the_new_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    with tcp_procs() as pm:
        record = tmp_path / "record"
        recorder = pm.spawn("recorder", Recorder, str(record))
        pid, address = recorder.where.call_one().get(timeout=30)
        assert address.startswith("tcp:")
        freeze(pid)
        try:
            for seq in range(BURST):
                recorder.record.broadcast(seq, PAD)
            calls = [recorder.echo.call_one(i) for i in range(CALLS)]
            received, unsent = wait_until(
                lambda: (q := in_kernel(address))[0] and q, 10, "the proc's receive queue to fill"
            )
            assert received + unsent < BURST * len(PAD) // 2, "the kernel took most of the burst"
            kill_connections_to(address)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert [c.get(timeout=60) for c in calls] == list(range(CALLS))
        seen = [int(line) for line in record.read_text().split()]  # the calls ran after them
        assert seen == sorted(set(seen)), "a broadcast ran twice or out of order"
        gaps = [(a, b) for a, b in zip(seen, seen[1:], strict=False) if b != a + 1]
        assert len(gaps) <= 1, gaps  # what the reset discarded in the client's kernel, if anything
        queued_from = gaps[0][1] if gaps else seen[0]
        assert seen[-1] == BURST - 1 and BURST - queued_from > BURST // 2, (queued_from, BURST)
        assert len(faults) <= 1, [f.report() for f in faults]
        for fault in faults:
            assert "record(): the connection closed in the middle of this message" in fault.report()
