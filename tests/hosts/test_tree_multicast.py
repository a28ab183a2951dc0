"""Tree multicast on 2 hosts x 2 procs (``local:2``): the client sends one frame per host for
``call``/``broadcast``/``stream`` (counted on the client's connections), replies come back one
frame per host, a sender's direct and multicast messages keep their order, and failures still
reach the caller at once and the owner."""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from actors import Counter, Gate
from helpers import wait_until

import monarch.actor
from monarch._src.actor import multicast
from monarch._src.actor.process_state import runtime
from monarch._src.wire import payload, protocol
from monarch.actor import ActorError, MeshFailure, SupervisionError, endpoint

pytestmark = pytest.mark.timeout(60)
#: The frames counted here are the client's only: no heartbeat pings among them (``hosts2``).
HOST_HEARTBEAT = False


class Log(Counter):
    """Remembers the order its messages ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    @endpoint
    def add(self, i: int) -> None:
        self.seen.append(i)

    @endpoint
    def log(self) -> list[int]:
        return self.seen

    @endpoint
    def fail_on(self, pid: int) -> int:
        if os.getpid() == pid:
            raise ValueError("boom on the chosen rank")
        return os.getpid()

    @endpoint
    def echo_size(self, data: bytes, reply_bytes: int) -> bytes:
        """A large argument in, a large reply out (both through shared memory on one host)."""
        return bytes([len(data) % 251]) * reply_bytes

    @endpoint
    def die_on(self, pid: int) -> int:
        if os.getpid() == pid:
            os.kill(pid, signal.SIGKILL)
        return os.getpid()


def _sent(addresses: list[str]) -> dict[str, int]:
    counts = runtime().frames_sent()
    return {a: counts.get(a, 0) for a in addresses}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {a: after[a] - before[a] for a in before}


@pytest.fixture
def replies_received() -> Iterator[collections.Counter[int]]:
    """How many reply frames (PORT, PORT_BATCH) reach this process, by kind."""
    from monarch._src.actor import port

    counts: collections.Counter[int] = collections.Counter()
    rt = runtime()
    handlers = {protocol.PORT_KIND: port.handle_port_frame, protocol.PORT_BATCH_KIND: port.handle_port_batch}
    for kind, handler in handlers.items():
        rt.register(kind, lambda h, b, handler=handler: (counts.update([h[protocol.KIND]]), handler(h, b)))
    yield counts
    for kind, handler in handlers.items():
        rt.register(kind, handler)


def _spawn(hosts2: Any) -> tuple[Any, list[str], list[str]]:
    """A Log mesh on 2 hosts x 2 procs, with the sessions' and the procs' addresses."""
    procs = hosts2.spawn_procs(per_host={"gpus": 2})
    logs = procs.spawn("logs", Log)
    logs.pid.call().get(timeout=20)  # every connection is made
    ranks = logs._ref.dest_addresses()
    sessions = sorted({multicast.forwarders[a] for a in ranks})
    assert len(sessions) == 2 and len(set(ranks)) == 4
    return logs, sessions, ranks


def test_call_broadcast_and_stream_send_one_frame_per_host(
    hosts2: Any, replies_received: collections.Counter[int]
) -> None:
    logs, sessions, ranks = _spawn(hosts2)
    one_each = {**{s: 1 for s in sessions}, **{r: 0 for r in ranks}}

    before = _sent(sessions + ranks)
    replies_received.clear()
    values = logs.pid.call().get(timeout=20)
    assert _delta(before, _sent(sessions + ranks)) == one_each
    assert len(set(values.values())) == 4
    # ... and the 4 replies came back as one frame from each host.
    assert replies_received == {protocol.PORT_BATCH_KIND: 2}

    before = _sent(sessions + ranks)
    logs.incr.broadcast(3)
    assert _delta(before, _sent(sessions + ranks)) == one_each
    assert list(logs.value.call().get(timeout=20).values()) == [3, 3, 3, 3]

    before = _sent(sessions + ranks)
    assert sorted(f.get(timeout=20) for f in logs.value.stream()) == [3, 3, 3, 3]
    assert _delta(before, _sent(sessions + ranks)) == one_each

    # A single destination (call_one, choose, a one-proc slice of a host) goes straight there.
    before = _sent(sessions + ranks)
    assert logs.slice(hosts=1, gpus=0).value.call_one().get(timeout=20) == 3
    assert logs.value.choose().get(timeout=20) == 3
    delta = _delta(before, _sent(sessions + ranks))
    assert all(delta[s] == 0 for s in sessions) and sum(delta[r] for r in ranks) == 2


def test_large_arguments_and_replies_travel_through_the_forwarders(hosts2: Any) -> None:
    logs, sessions, ranks = _spawn(hosts2)
    big = os.urandom(3 << 20)
    before = _sent(sessions + ranks)
    replies = logs.echo_size.call(big, 2 << 20).get(timeout=30)
    delta = _delta(before, _sent(sessions + ranks))  # (a session may also get buffers given back)
    assert all(delta[s] >= 1 for s in sessions) and all(delta[r] == 0 for r in ranks), delta
    assert [r == bytes([len(big) % 251]) * (2 << 20) for r in replies.values()] == [True] * 4
    for _ in range(3):  # shared-memory buffers lent on the way are given back and reused
        assert len(logs.echo_size.call(big, 1 << 20).get(timeout=30)) == 4


def test_a_senders_direct_and_multicast_messages_arrive_in_send_order(hosts2: Any) -> None:
    logs, _, _ = _spawn(hosts2)
    first = logs.slice(hosts=1, gpus=1)
    expected = []
    for i in range(300):  # alternate paths: direct call_one and multicast broadcast
        if i % 3 == 0:
            first.add.call_one(i)
        else:
            logs.add.broadcast(i)
        expected.append(i)
    assert first.log.call_one().get(timeout=30) == expected
    others = logs.log.call().get(timeout=30)
    assert others.item(hosts=0, gpus=0) == [i for i in expected if i % 3]


def test_an_exception_on_one_rank_fails_the_gathered_call(hosts2: Any) -> None:
    logs, _, _ = _spawn(hosts2)
    victim = logs.slice(hosts=1, gpus=0).pid.call_one().get(timeout=20)
    with pytest.raises(ActorError, match="boom on the chosen rank"):
        logs.fail_on.call(victim).get(timeout=20)
    assert len(logs.slice(hosts=0).fail_on.call(victim).get(timeout=20)) == 2


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    """The mesh failures that reach the client (the owner of every mesh here)."""
    seen: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", seen.append)
    return seen


def test_a_proc_killed_under_a_tree_call_fails_that_call_at_once(
    hosts2: Any, faults: list[MeshFailure]
) -> None:
    logs, _, _ = _spawn(hosts2)
    victim = logs.slice(hosts=1, gpus=1).pid.call_one().get(timeout=20)
    started = time.monotonic()
    with pytest.raises(SupervisionError, match="Killed|exited|signal") as info:
        logs.die_on.call(victim).get(timeout=20)
    assert time.monotonic() - started < 10
    assert "logs.die_on() failed" in str(info.value), info.value
    wait_until(lambda: faults, timeout=20, what="the owner hears of the death too")
    assert str(victim) in faults[0].report() or "Killed" in faults[0].report(), faults[0].report()


def test_a_broadcast_failing_on_a_remote_rank_reaches_the_owner(
    hosts2: Any, faults: list[MeshFailure]
) -> None:
    logs, _, _ = _spawn(hosts2)
    victim = logs.slice(hosts=0, gpus=1).pid.call_one().get(timeout=20)
    logs.fail_on.broadcast(victim)
    wait_until(lambda: faults, timeout=20, what="the owner hears of the failed broadcast")
    assert "boom on the chosen rank" in faults[0].report()


def test_a_call_whose_forwarder_connection_dropped_runs_once(hosts2: Any) -> None:
    """The forwarder read the call before its connection dropped, or it is sent again as the
    forwarder's answer to the new connection's hello says it did not: it runs once, and is not
    failed as "may or may not have run"."""
    procs = hosts2.spawn_procs(per_host={"gpus": 2})
    gates = procs.spawn("gates", Gate)
    pending = gates.wait.call()
    session = multicast.forwarders[gates._ref.dest_addresses()[0]]
    rt = runtime()
    conn = rt._conns[session]
    wait_until(lambda: conn.frames_sent and not conn._queue, what="the call left for the forwarder")
    rt.loop_thread.call_soon(conn.close)  # the connection drops under a live forwarder
    assert list(gates.release.call().get(timeout=20).values()) == ["released"] * 4
    assert list(pending.get(timeout=20).values()) == ["done"] * 4


@pytest.mark.slow
def test_frames_behind_one_that_never_arrives_are_delivered_after_the_gap_bound(hosts2: Any) -> None:
    logs, _, _ = _spawn(hosts2)
    one = logs.slice(hosts=0, gpus=0)
    address = one._ref.dest_addresses()[0]
    # Frame 1 of a sender whose frame 0 was lost on the way: held, then delivered anyway.
    header = protocol.message(one._ref.key, "add", None, 0, [[], []])
    header[protocol.SEQUENCE] = ["unix:/a/sender/whose/frame/0/was/lost", 1]
    sent = time.monotonic()
    runtime().send(address, header, payload.dumps(((7,), {})))
    assert one.log.call_one().get(timeout=20) == []  # held behind the missing frame
    wait_until(lambda: one.log.call_one().get(timeout=20) == [7], timeout=3 * multicast.GAP_TIMEOUT_S)
    assert time.monotonic() - sent >= multicast.GAP_TIMEOUT_S - 0.5
