"""Connections from a live peer dropped while the question of what was read is open.

A worker sends a burst of broadcasts, then calls, to an actor of the client process. The client
stops reading the worker's connection (its transport paused), so the burst piles up in the
kernel and in the worker; then it shuts down its end of it, which the worker takes for a drop:
it reconnects, and its new connection's hello waits behind the old one, which still carries
frames (``behind``). The client aborts that new connection before the old one delivered them,
so the worker's next connection asks again which messages of the first one were read. It is
told once the old one delivered them (it waits there in place of the one dropped), or at once
if the old one ended first: every message runs exactly once, in the order sent, and every call
returns its value (the answer used to be "unknown": none was sent again, and the newer
messages ran before the older ones still in the old connection).

When the client has no record left of the old connection (the worker stayed silent past
``peer_unreachable_s``), the answer is "unknown": the worker sends none of the messages it had
written again, so that none runs twice; calls among them fail with a clear error, and the
owner of the actor they were for hears that it may not have received them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import struct
import termios
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_helpers import on_loop
from helpers import freeze, wait_until

import monarch.actor
from monarch._src.actor.process_state import runtime
from monarch._src.runtime.config import configured
from monarch._src.transport.connection import IncomingConnection
from monarch.actor import Actor, MeshFailure, endpoint, this_host, this_proc

PAD = b"x" * 1024
#: Broadcasts in the burst: more than the kernel's buffers of a Unix socket take.
BURST = 4096
CALLS = 20


class Recorder(Actor):
    """Runs in the client: writes the sequence numbers of the broadcasts it runs to a file, one
    a line, in order, and answers calls."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)  # open while the actor lives

    @endpoint
    def record(self, seq: int, pad: bytes) -> None:
        self.file.write(f"{seq}\n")

    @endpoint
    def echo(self, x: Any) -> Any:
        return x


class Sender(Actor):
    """Runs in the worker: sends the burst and the calls to the client's recorder."""

    @endpoint
    async def where(self) -> tuple[int, str]:
        return os.getpid(), runtime().address

    @endpoint
    async def send(self, target: Any, n: int) -> None:
        """``CALLS`` calls, then ``n`` broadcasts."""
        self.calls = [target.echo.call_one(i) for i in range(CALLS)]
        for seq in range(n):
            target.record.broadcast(seq, PAD)

    @endpoint
    async def answers(self) -> list[Any]:
        """Each call's value, or its error's type and first line; "pending" after 20 s."""
        settled: list[Any] = []
        for call in self.calls:
            try:
                settled.append(await asyncio.wait_for(asyncio.ensure_future(call), 20))
            except asyncio.TimeoutError:
                settled.append("pending")
            except Exception as e:
                settled.append(f"{type(e).__name__}: {str(e).splitlines()[0]}")
        return settled


def seen(record: Path) -> list[int]:
    return [int(line) for line in record.read_text().split()]


def connections_from(peer: str) -> list[IncomingConnection]:
    """(loop thread) The client's open connections from ``peer`` to its own address."""
    rt = runtime()
    return [c for c in rt._incoming if c.peer == peer and c.local_address == rt.address]


def unread_bytes(conn: IncomingConnection) -> int:
    """Bytes waiting in the kernel for ``conn`` to read."""
    fd = conn.transport.get_extra_info("socket").fileno()  # type: ignore[union-attr]
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def shut_down_writing(conn: IncomingConnection) -> None:
    """Shut down the client's sending half of ``conn``: the worker reads its end, a drop."""
    fd = conn.transport.get_extra_info("socket").fileno()  # type: ignore[union-attr]
    dup = socket.socket(fileno=os.dup(fd))
    try:
        dup.shutdown(socket.SHUT_WR)
    finally:
        dup.close()  # the descriptor only: the transport's stays open


@contextlib.contextmanager
def burst_unread(
    monkeypatch: pytest.MonkeyPatch, record: Path
) -> Iterator[tuple[Any, int, str, IncomingConnection]]:
    """A worker whose sender has sent the recorder, an actor of this process, the first
    broadcast (run), then ``CALLS`` calls and ``BURST`` more, which the client does not read
    (the worker's connection paused here) and the kernel holds in part: ``(sender, its pid,
    its address, that connection)``. The unhandled faults go to ``FAULTS``."""
    FAULTS.clear()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", FAULTS.append)
    recorder = this_proc().spawn("recorder", Recorder, str(record))
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        sender = pm.spawn("sender", Sender)
        pid, peer = sender.where.call_one().get(timeout=30)
        sender.send.call_one(recorder, 1).get(timeout=30)
        wait_until(lambda: seen(record) == [0], 10, "the first broadcast")
        (old,) = on_loop(lambda: connections_from(peer))
        on_loop(old.transport.pause_reading)
        sender.send.call_one(recorder, BURST).get(timeout=30)
        wait_until(lambda: unread_bytes(old) > 64 * len(PAD), 10, "the burst to fill the kernel")
        yield sender, pid, peer, old
    finally:
        pm.stop().get(timeout=10)


FAULTS: list[MeshFailure] = []


def dropped_with_frames_unread(old: IncomingConnection) -> Any:
    """Drop ``old`` at the worker's end (this process shuts down its own end for writing): the
    worker's new connection then waits behind it here; that wait."""
    on_loop(lambda: shut_down_writing(old))
    return wait_until(
        lambda: on_loop(lambda: runtime()._behind.get(old)), 10, "the new connection to wait behind"
    )


def each_ran_once_in_order(record: Path, answers: list[Any]) -> None:
    """Every broadcast of the burst ran once, in order; every call returned its value; no fault."""
    burst = seen(record)[1:]  # after the first one's 0
    twice = len(burst) - len(set(burst))
    gaps = [(a, b) for a, b in zip(burst, burst[1:], strict=False) if b != a + 1]
    assert burst == list(range(BURST)), (len(burst), twice, gaps[:5])
    assert answers == list(range(CALLS)), answers
    assert FAULTS == [], [f.report() for f in FAULTS]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("old_ends_first", [False, True], ids=["next-hello-first", "old-ends-first"])
def test_a_replacement_dropped_while_it_waited_behind_the_old_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, old_ends_first: bool
) -> None:
    """``old_ends_first``: the worker is frozen from before the new connection is dropped until
    the old one delivered what it carried and ended here, so that the next hello comes after
    that (else it comes while the old one still carries frames)."""
    rt = runtime()
    record = tmp_path / "record"
    with burst_unread(monkeypatch, record) as (sender, pid, peer, old):
        link = (peer, rt.address)
        waiting = dropped_with_frames_unread(old)
        if old_ends_first:
            freeze(pid)
        try:
            on_loop(lambda: waiting._new.abort(ConnectionResetError("dropped by the test")))
            if old_ends_first:
                on_loop(old.transport.resume_reading)
                wait_until(lambda: old.closed, 10, "the old connection to end")
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(
            lambda: on_loop(
                lambda: len(connections_from(peer)) == 2 - old.closed and rt._from_peer.get(link)
            ),
            10,
            "the next connection's hello",
        )
        if not old_ends_first:
            on_loop(old.transport.resume_reading)
        answers = sender.answers.call_one().get(timeout=60)
        wait_until(lambda: len(seen(record)) > BURST, 10, "the burst to run")
    each_ran_once_in_order(record, answers)


@pytest.mark.timeout(90)
def test_a_hello_nobody_can_answer_sends_nothing_written_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The client drops the worker's connection while the worker is frozen, and gives up on
    hearing from it (``peer_unreachable_s``): its next hello is answered "unknown"."""
    rt = runtime()
    record = tmp_path / "record"
    with burst_unread(monkeypatch, record) as (sender, pid, peer, old):
        link = (peer, rt.address)
        freeze(pid)
        try:
            with configured(peer_unreachable_s=0.5):
                on_loop(lambda: old.abort(ConnectionResetError("dropped by the test")))
                wait_until(lambda: on_loop(lambda: link not in rt._drops), 10, "the client to give up")
        finally:
            os.kill(pid, signal.SIGCONT)
        answers = sender.answers.call_one().get(timeout=60)
        wait_until(lambda: FAULTS, 10, "the owner to hear")
    burst = seen(record)[1:]
    twice = len(burst) - len(set(burst))
    assert twice == 0 and burst == sorted(burst), (twice, burst[:5])
    assert burst[-1] == BURST - 1, "the messages never written on the old connection did not come"
    assert "pending" not in answers, answers
    failed = [a for i, a in enumerate(answers) if a != i]
    assert failed, "no call was lost: the test lost its point"
    assert all(a.startswith("ConnectionError: ") and "may or may not have run" in a for a in failed), failed
    reports = [f.report() for f in FAULTS]
    missing = BURST - len(burst)
    assert missing, "no message was lost: the test lost its point"
    (report,) = reports
    assert "recorder[0] may not have received " in report and "so that none runs twice" in report, report
    said = int(report.split("may not have received ")[1].split()[0])
    assert said >= missing, (said, missing)


@pytest.mark.timeout(90)
def test_a_replacement_dropped_at_the_sender_while_it_waited_behind_the_old_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Three faults: the old connection drops, then its replacement drops at the worker's end
    (this process shuts down its own end for writing: the worker reads its end). This process
    does not read the replacement while it waits behind the old one (paused), so it does not
    see that drop: the next hello comes while the replacement is still open here. The next
    connection waits in its place, is told the exact count once the old one delivered what it
    carried, and the replacement is closed here (it was answered "unknown": the worker sent
    nothing again and failed its calls, the owner heard that messages may be lost, and the
    next connection's messages ran before the older ones still in the old connection)."""
    rt = runtime()
    record = tmp_path / "record"
    with burst_unread(monkeypatch, record) as (sender, pid, peer, old):
        link = (peer, rt.address)
        waiting = dropped_with_frames_unread(old)
        dropped = waiting._new
        on_loop(lambda: shut_down_writing(dropped))
        wait_until(
            lambda: on_loop(lambda: rt._from_peer.get(link) not in (None, old, dropped)),
            10,
            "the next connection's hello",
        )
        on_loop(old.transport.resume_reading)
        answers = sender.answers.call_one().get(timeout=60)
        wait_until(lambda: len(seen(record)) > BURST, 10, "the burst to run")
    each_ran_once_in_order(record, answers)
    # Closed here as replaced, not read to its end (which would make it the double fault).
    assert "replaced it before it was told" in str(dropped.close_reason), dropped.close_reason
