"""A TCP connection reset from outside (``ss -K``) with messages still queued in the client:
every one runs once, in order.

The proc is frozen (SIGSTOP) while the client sends it a burst of broadcasts larger than both
sockets' buffers, then calls: the calls, and the burst's tail, are queued in the client when
the connection is reset. The reset also discards what the kernels held: the client's send
queue, and the frame the proc had begun to read. The proc says, in answer to the new
connection's hello, how many frames of the old one it read; the client sends again those it
wrote that the proc did not read (it keeps them until the proc acknowledges them), then the
queued ones. Once the proc resumes, every call returns its value (none fails as "may or may
not have run"), every broadcast runs exactly once, in order, and nothing is reported.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import freeze, wait_until
from tcp_helpers import Where, tcp_procs
from test_tcp_peer_loss import kill_connections_to

import monarch.actor
from monarch._src.actor.process_state import runtime
from monarch._src.runtime.config import configured
from monarch._src.transport.address import TcpAddress, parse
from monarch._src.transport.outgoing import TAG_RECORD, UNKEPT_RUNS
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


def burst_cut_by_a_reset(pm: Any, record: Path) -> tuple[str, list[int]]:
    """Freeze the recorder's proc, send it ``BURST`` broadcasts and ``CALLS`` calls, reset the
    connection (``ss -K``) once the kernels hold part of the burst, and resume it: its address,
    and the broadcasts it ran, in the order it ran them (the calls returned their values)."""
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
    return address, [int(line) for line in record.read_text().split()]  # the calls ran after them


@pytest.mark.timeout(120)
def test_messages_queued_when_a_tcp_connection_is_reset_go_first_on_the_new_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    with tcp_procs() as pm:
        _, seen = burst_cut_by_a_reset(pm, tmp_path / "record")
    gaps = [(a, b) for a, b in zip(seen, seen[1:], strict=False) if b != a + 1]
    assert seen == list(range(BURST)), (len(seen), seen[:3], gaps[:5])
    assert faults == [], [f.report() for f in faults]


@pytest.mark.timeout(120)
def test_messages_lost_in_the_kernel_and_no_longer_kept_are_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The client keeps no written message (``resend_keep_messages=0``): those the reset
    discarded are lost, and it says how many, exactly, in its log and to the owner of the actor
    they were for (here the client itself), once, with the frame the proc had begun to read
    among them. The others still run once, in order."""
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    runtime()  # sets up monarch's logger, which does not propagate: caplog's handler is the root's
    monkeypatch.setattr(logging.getLogger("monarch"), "propagate", True)
    with configured(resend_keep_messages=0), tcp_procs() as pm:
        address, seen = burst_cut_by_a_reset(pm, tmp_path / "record")
    gaps = [(a, b) for a, b in zip(seen, seen[1:], strict=False) if b != a + 1]
    assert seen[0] == 0 and seen[-1] == BURST - 1 and len(gaps) == 1, gaps
    ((last_read, first_resent),) = gaps
    lost = first_resent - last_read - 1
    said = [r.getMessage() for r in caplog.records if "were never read there" in r.getMessage()]
    assert said and said[0].startswith(f"{lost} messages written to {address} were never read"), (lost, said)
    (report,) = [f.report() for f in faults]
    assert f"recorder[0] never received {lost} messages sent to it by " in report, (lost, report)
    assert "HINT: MONARCH_RESEND_KEEP_MESSAGES" in report, report


@pytest.mark.timeout(120)
def test_losses_beyond_the_record_of_their_destinations_are_reported_to_every_actor_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nothing kept, and broadcasts alternate between two actors of the frozen proc: the
    client's record of where the lost ones were going (``UNKEPT_RUNS`` runs) overflows, and
    each actor's owner hears, once, of the latest recorded for it and of the older ones, which
    may have been for it: all the lost ones are counted. Each actor still runs the others once,
    in order."""
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    with configured(resend_keep_messages=0), tcp_procs() as pm:
        meshes = [pm.spawn(name, Recorder, str(tmp_path / name)) for name in ("a", "b")]
        pid, address = meshes[0].where.call_one().get(timeout=30)
        meshes[1].where.call_one().get(timeout=30)
        freeze(pid)
        try:
            for seq in range(BURST // 2):
                for mesh in meshes:
                    mesh.record.broadcast(seq, PAD)
            wait_until(lambda: in_kernel(address)[0], 10, "the proc's receive queue to fill")
            kill_connections_to(address)
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: len(faults) == 2, 30, "both owners to hear")
        wait_until(
            lambda: all(int((tmp_path / n).read_text().split()[-1]) == BURST // 2 - 1 for n in "ab"),
            30,
            "the broadcasts resent to run",
        )
    counted = missing = 0
    for name, report in zip("ab", sorted(f.report() for f in faults), strict=True):
        said = re.match(
            rf"The actor {name}\[0\] never received (\d+) messages .*, and maybe some of (\d+) more", report
        )
        assert said and "HINT: MONARCH_RESEND_KEEP_MESSAGES" in report, report
        recorded, unrecorded = int(said[1]), int(said[2])
        assert 0 < recorded < UNKEPT_RUNS, report
        counted += recorded
        seen = [int(line) for line in (tmp_path / name).read_text().split()]
        assert seen == sorted(set(seen)), "a broadcast ran twice, or out of order"
        missing += BURST // 2 - len(seen)
    assert counted + unrecorded == missing, (counted, unrecorded, missing)


class Asker(Where):
    """Calls another proc's ``echo`` many times at once, and later says what came back."""

    @endpoint
    async def ask(self, target: Any, n: int, pad: bytes = PAD) -> None:
        self.calls = [target.echo.call_one((i, pad)) for i in range(n)]
        await self.calls[0]  # the calls went out (as far as the kernel took them)

    @endpoint
    async def answers(self) -> list[Any]:
        return [(await call)[0] for call in self.calls]


def addresses_of(pid: int) -> list[str]:
    """The TCP addresses process ``pid`` listens at (its own, and its loops' reply addresses)."""
    out = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, timeout=10, check=True).stdout
    return [f"tcp:{line.split()[3]}" for line in out.splitlines() if f"pid={pid}," in line]


def replies_cut_by_a_reset(
    asker: Any, echo: Any, n: int, pad: bytes, piled_up: Callable[[list[str]], bool]
) -> None:
    """``asker`` (an ``Asker``) calls ``echo`` ``n`` times with ``pad`` and is frozen; once
    ``piled_up(the addresses it listens at)``, the connections to them are reset, and it
    resumes."""
    pid, _ = asker.where.call_one().get(timeout=30)
    echo.echo.call_one(None).get(timeout=30)
    asker.ask.call_one(echo, 1).get(timeout=30)
    asker.answers.call_one().get(timeout=30)  # the echo proc's connections are open
    addresses = addresses_of(pid)
    freeze(pid)
    try:
        # Sent while frozen: the asker reads the call, and its calls go out, once resumed.
        asking = asker.ask.call_one(echo, n, pad)
        os.kill(pid, signal.SIGCONT)
        asking.get(timeout=30)
        freeze(pid)
        wait_until(lambda: piled_up(addresses), 10, "replies to pile up in the kernels")
        for address in addresses:
            kill_connections_to(address)
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.timeout(120)
def test_replies_lost_in_the_kernel_by_a_reset_are_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replies pile up in the kernels while the caller's proc is frozen; the connections they
    travel on are reset: the replier sends again those the caller did not read, and every call
    returns its value (none fails as "may or may not have run")."""
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    with tcp_procs() as asker_procs, tcp_procs() as echo_procs:
        asker = asker_procs.spawn("asker", Asker)
        echo = echo_procs.spawn("echo", Recorder, os.devnull)
        replies_cut_by_a_reset(
            asker, echo, CALLS * 100, PAD, lambda at: sum(in_kernel(a)[0] for a in at) > len(PAD) * CALLS
        )
        assert asker.answers.call_one().get(timeout=60) == list(range(CALLS * 100))
    assert faults == [], [f.report() for f in faults]


#: Broadcasts the recorder reads before the first reset: fewer than the frames and bytes after
#: which it acknowledges (``read_count.ACK_FRAMES``, ``ACK_BYTES``), so the sender still keeps
#: them for a resend.
READ_FIRST = 256


class Sender(Where):
    """Broadcasts to the recorder from a proc of its own, which the test can freeze."""

    @endpoint
    async def send(self, target: Any, first: int, n: int) -> None:
        for seq in range(first, first + n):
            target.record.broadcast(seq, PAD)

    @endpoint
    async def through(self, target: Any) -> None:
        """Returns once the target ran every broadcast this proc sent it before."""
        await target.echo.call_one(None)


def sockets_to(pid: int, address: str) -> dict[int, int]:
    """``{local port: bytes in its receive queue}`` of process ``pid``'s TCP connections to
    ``address``."""
    parsed = parse(address)
    assert isinstance(parsed, TcpAddress)
    command = ["ss", "-tnpH", "dst", parsed.host, "dport", "=", f":{parsed.port}"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout
    lines = [line.split() for line in out.splitlines() if f"pid={pid}," in line]
    return {int(f[3].rsplit(":", 1)[1]): int(f[1]) for f in lines}


def received_from(address: str, port: int) -> int:
    """Bytes in the receive queue of the connection at ``address`` from local port ``port``."""
    parsed = parse(address)
    assert isinstance(parsed, TcpAddress)
    match = ["src", parsed.host, "sport", "=", f":{parsed.port}", "dport", "=", f":{port}"]
    out = subprocess.run(
        ["ss", "-tnH", *match], capture_output=True, text=True, timeout=10, check=True
    ).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.split())


def reset(address: str, port: int) -> None:
    """Abort the connection to ``address`` from local port ``port`` (``ss -K``; the peer gets a
    reset)."""
    parsed = parse(address)
    assert isinstance(parsed, TcpAddress)
    match = ["dst", parsed.host, "dport", "=", f":{parsed.port}", "sport", "=", f":{port}"]
    done = subprocess.run(["ss", "-K", *match], capture_output=True, text=True, timeout=10)
    if done.returncode != 0 or parsed.host not in done.stdout:
        pytest.skip(f"cannot abort TCP connections with ss -K here: {done.stderr.strip()}")


@pytest.mark.timeout(180)
def test_a_second_reset_before_the_sender_read_the_count_resends_nothing_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The recorder read ``READ_FIRST`` broadcasts the sender still keeps, then the rest of a
    burst piles up in the kernels (the recorder frozen) and the connection is reset. Both procs
    are then frozen and resumed in turn, so that the replacement's handshake goes step by step,
    until its hello waits in the recorder's receive queue: the replacement is reset there. The
    recorder reads the hello and answers (the reset loses the answer), then the connection after
    it asks again: the recorder answers with the count of all the frames it read (not of the
    replacement's, which carried none, after which the read ones would run twice), and
    every broadcast runs exactly once, in order."""
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    record = tmp_path / "record"
    with tcp_procs() as sender_procs, tcp_procs() as recorder_procs:
        recorder = recorder_procs.spawn("recorder", Recorder, str(record))
        sender = sender_procs.spawn("sender", Sender)
        r_pid, address = recorder.where.call_one().get(timeout=30)
        s_pid, _ = sender.where.call_one().get(timeout=30)
        sender.send.call_one(recorder, 0, READ_FIRST).get(timeout=30)
        sender.through.call_one(recorder).get(timeout=30)  # read, not yet acknowledged
        freeze(r_pid)
        try:
            sender.send.call_one(recorder, READ_FIRST, BURST).get(timeout=30)
            wait_until(lambda: in_kernel(address)[0], 10, "the recorder's receive queue to fill")
            freeze(s_pid)
            try:
                (first,) = sockets_to(s_pid, address)
                reset(address, first)
                os.kill(s_pid, signal.SIGCONT)  # it connects anew and sends its nonce
                (second,) = wait_until(
                    lambda: [
                        p for p in sockets_to(s_pid, address) if p != first and received_from(address, p)
                    ],
                    10,
                    "the sender's new connection",
                )
                freeze(s_pid)
                # Each side's turn in the handshake: challenge, proof, server proof, hello.
                for runs in (r_pid, s_pid, r_pid, s_pid):
                    os.kill(runs, signal.SIGCONT)
                    if runs == r_pid:
                        wait_until(lambda: sockets_to(s_pid, address).get(second), 10, "the recorder's turn")
                    else:
                        wait_until(lambda: received_from(address, second), 10, "the sender's turn")
                    freeze(runs)
                # The recorder reads the hello, then the reset: its count never gets out.
                reset(address, second)
            finally:
                os.kill(s_pid, signal.SIGCONT)
        finally:
            os.kill(r_pid, signal.SIGCONT)
        sender.through.call_one(recorder).get(timeout=60)
    seen = [int(line) for line in record.read_text().split()]
    twice = len(seen) - len(set(seen))
    assert seen == list(range(READ_FIRST + BURST)), (len(seen), twice, seen[READ_FIRST - 2 : READ_FIRST + 2])
    assert faults == [], [f.report() for f in faults]


class KeepingEcho(Where):
    """Echoes, and says how many of the messages it wrote its peers never read, and it no
    longer kept to send again (its connections' ``unread_lost``)."""

    @endpoint
    async def lost(self) -> int:
        return sum(conn.unread_lost or 0 for conn in runtime()._conns.values())


#: The replies the echo proc keeps for a resend in the test below (fewer than the reset
#: discards), and their size.
KEEP_REPLIES = 64
REPLY_PAD = b"x" * (16 << 10)


class Settler(Asker):
    """``Asker`` that says how each of its calls settled: its value, or the error's type."""

    @endpoint
    async def outcomes(self) -> list[Any]:
        """Each call's value or error type; "pending" for one still unsettled after 20 s."""
        settled: list[Any] = []
        for call in self.calls:
            try:
                settled.append((await asyncio.wait_for(asyncio.ensure_future(call), 20))[0])
            except asyncio.TimeoutError:
                settled.append("pending")
            except ConnectionError:
                settled.append("ConnectionError")
        return settled


@pytest.mark.timeout(120)
def test_replies_kept_for_a_resend_complete_their_calls_when_older_ones_were_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The echo proc keeps only its last ``KEEP_REPLIES`` unacknowledged replies: a reset of the
    connections to the frozen caller loses the older unread ones, whose calls, and only those,
    fail with a ``ConnectionError`` ("may or may not have run"); the kept ones are sent again
    and their calls return their values (they used to fail too, as if lost). Every call
    settles once."""
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    n = TAG_RECORD - 100  # the echo proc's record of which frames were replies misses none
    keep = {"MONARCH_RESEND_KEEP_MESSAGES": str(KEEP_REPLIES)}
    with tcp_procs() as asker_procs, tcp_procs(env=keep) as echo_procs:
        asker = asker_procs.spawn("asker", Settler)
        echo = echo_procs.spawn("echo", KeepingEcho)
        # More than it keeps in the echo proc's send queue, which the reset discards.
        replies_cut_by_a_reset(
            asker,
            echo,
            n,
            REPLY_PAD,
            lambda at: sum(in_kernel(a)[1] for a in at) > len(REPLY_PAD) * 2 * KEEP_REPLIES,
        )
        outcomes = asker.outcomes.call_one().get(timeout=60)
        lost = echo.lost.call_one().get(timeout=30)
    failed = [i for i, o in enumerate(outcomes) if o == "ConnectionError"]
    assert all(o == i for i, o in enumerate(outcomes) if i not in failed), outcomes
    assert lost, "no reply was lost: the test lost its point"
    assert failed == list(range(failed[0], failed[0] + lost)), (lost, failed)  # the unread, unkept ones
    assert faults == [], [f.report() for f in faults]
