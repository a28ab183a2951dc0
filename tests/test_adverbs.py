"""Endpoint adverbs: call, call_one, choose, stream, broadcast, send, Accumulator."""

from __future__ import annotations

import asyncio
import gc
import operator
import os
import re
import weakref

import actors
import psutil
import pytest

from monarch.actor import (
    Accumulator,
    Actor,
    ActorError,
    Channel,
    Extent,
    Future,
    Point,
    ValueMesh,
    concurrent_endpoint,
    context,
    current_rank,
    endpoint,
    send,
    this_proc,
)


class Counter(actors.Counter):
    @endpoint
    def my_rank(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    def echo(self, x):
        return (x, context().actor_instance.rank.rank)

    @endpoint
    def run(self, fn):
        return fn()


class Turns(Actor):
    """Rank 0 answers ``turn`` only once released; rank 1 answers at once."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    @concurrent_endpoint
    async def turn(self) -> int:
        rank = context().actor_instance.rank.rank
        if rank == 0:
            await self.event.wait()
        return rank

    @endpoint
    async def release(self) -> None:
        self.event.set()

    @endpoint
    async def fail_on(self, rank: int) -> int:
        me = context().actor_instance.rank.rank
        if me == rank:
            raise ValueError(f"rank {me} refuses")
        return me


@pytest.fixture
def counters(procs2):
    return procs2.spawn("counter", Counter, 0)


def test_this_proc_spawn_runs_in_client_process():
    c = this_proc().spawn("local_counter", Counter, 7)
    try:
        assert c.value.call_one().get(timeout=10) == 7
        assert c.pid.call_one().get(timeout=10) == os.getpid()
    finally:
        c.stop().get(timeout=10)


def test_spawn_procs_runs_actors_in_distinct_child_processes(procs2):
    c = procs2.spawn("counter", Counter)
    pids = c.pid.call().get(timeout=10).values()
    assert len(pids) == 2
    assert len(set(pids)) == 2
    assert os.getpid() not in pids
    for pid in pids:
        assert psutil.Process(pid).is_running()


def test_call_returns_value_mesh(counters):
    counters.slice(gpus=1).incr.broadcast()
    vm = counters.value.call().get(timeout=10)
    assert isinstance(vm, ValueMesh)
    assert len(vm) == 2
    assert vm.values() == [0, 1]
    ext = Extent(["gpus"], [2])
    assert list(vm.items()) == [(Point(0, ext), 0), (Point(1, ext), 1)]
    assert [v for _, v in vm] == [0, 1]
    assert vm.item(gpus=0) == 0
    assert vm.item(gpus=1) == 1
    assert vm.slice(gpus=1).item() == 1
    assert vm.slice(gpus=slice(1, 2)).values() == [1]
    assert vm.extent.labels == ["gpus"]
    assert repr(vm) == "ValueMesh({gpus: 2}):\n  (({'gpus': 0/2}, 0), ({'gpus': 1/2}, 1))"


def test_call_on_a_slice_has_the_slice_extent(counters):
    vm = counters.slice(gpus=slice(1, 2)).my_rank.call().get(timeout=10)
    assert vm.extent == Extent(["gpus"], [1])
    assert vm.values() == [1]


def test_call_one_on_two_actors_raises_synchronously(counters):
    with pytest.raises(ValueError, match=re.escape("call_one requires exactly 1 actor, but mesh has 2")):
        counters.value.call_one()  # raised by the adverb itself, not by get()
    assert counters.slice(gpus=1).my_rank.call_one().get(timeout=10) == 1


def test_choose_picks_one_actor_and_balances(counters):
    seen = set()
    for _ in range(40):
        r = counters.my_rank.choose().get(timeout=10)
        assert r in (0, 1)
        seen.add(r)
    assert seen == {0, 1}


def test_stream_yields_one_future_per_actor(counters):
    counters.incr.broadcast(3)
    futures = list(counters.value.stream())
    assert len(futures) == 2
    assert all(isinstance(f, Future) for f in futures)
    assert [f.get(timeout=10) for f in futures] == [3, 3]


async def test_stream_futures_are_awaitable(counters):
    total = sum([await f for f in counters.my_rank.stream()])
    assert total == 1


def test_stream_resolves_in_arrival_order(procs2):
    turns = procs2.spawn("turns", Turns)
    first, second = turns.turn.stream()
    assert first.get(timeout=10) == 1  # rank 1 answered first
    assert not second.done()
    turns.slice(gpus=0).release.broadcast()
    assert second.get(timeout=10) == 0


def test_call_fails_if_any_rank_fails(procs2):
    turns = procs2.spawn("turns", Turns)
    with pytest.raises(ActorError, match="rank 1 refuses"):
        turns.fail_on.call(1).get(timeout=10)
    assert turns.fail_on.call(5).get(timeout=10).values() == [0, 1]
    with pytest.raises(ActorError, match="rank 0 refuses"):
        Accumulator(turns.fail_on, 0, operator.add).accumulate(0).get(timeout=10)


def test_call_one_on_empty_mesh_raises(counters):
    with pytest.raises(ValueError, match="call_one requires exactly 1 actor, but mesh has 0"):
        counters.slice(gpus=slice(0, 0)).value.call_one()
    assert counters.value.call().get(timeout=10).values() == [0, 0]


def test_broadcast_returns_none_and_takes_effect(counters):
    assert counters.incr.broadcast(5) is None
    assert counters.value.call().get(timeout=10).values() == [5, 5]


def test_send_with_port_all_and_choose(counters):
    port, receiver = Channel.open()
    assert send(counters.echo, ("all",), {}, port=port, selection="all") is None
    got = sorted(receiver.recv().get(timeout=10) for _ in range(2))
    assert got == [("all", 0), ("all", 1)]

    send(counters.echo, ("one",), {}, port=port, selection="choose")
    first = receiver.recv().get(timeout=10)
    assert first[0] == "one"
    # If `choose` had reached both actors, the second "one" reply would come next.
    send(counters.echo, ("again",), {}, port=port, selection="all")
    nxt = [receiver.recv().get(timeout=10)[0] for _ in range(2)]
    assert nxt == ["again", "again"]


def test_a_receiver_let_go_of_is_freed_and_one_waited_on_is_kept(counters):
    """A channel's receiver lives as long as its user keeps it, or a ``recv()`` of it waits:
    a program opening channels in a loop does not keep every receiver it ever made."""
    port, receiver = Channel.open()
    send(counters.echo, ("kept",), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=10)[0] == "kept"
    gone = weakref.ref(receiver)
    del receiver
    gc.collect()
    assert gone() is None
    send(counters.echo, ("to nobody",), {}, port=port, selection="choose")  # dropped there

    port, receiver = Channel.open()
    waiting = receiver.recv()
    waited = weakref.ref(receiver)
    del receiver
    gc.collect()
    assert waited() is not None
    send(counters.echo, ("waited for",), {}, port=port, selection="choose")
    assert waiting.get(timeout=10)[0] == "waited for"
    gc.collect()
    assert waited() is None
    assert counters.value.call().get(timeout=10).values() == [0, 0]  # (the echoes all ran)


def test_send_rejects_bad_selection(counters):
    with pytest.raises(ValueError):
        send(counters.echo, (1,), {}, selection="some")  # type: ignore[arg-type]


def test_accumulator_folds_replies(counters):
    counters.incr.broadcast()
    acc = Accumulator(counters.value, 0, operator.add)
    assert acc.accumulate().get(timeout=10) == 2
    # Left fold from the identity; every reply participates once.
    listing = Accumulator(counters.echo, ["start"], lambda a, x: a + [x[0]])
    assert listing.accumulate("v").get(timeout=10) == ["start", "v", "v"]


def test_accumulator_on_empty_mesh_gives_identity(counters):
    empty = counters.slice(gpus=slice(0, 0))
    assert len(empty) == 0
    assert Accumulator(empty.value, 42, operator.add).accumulate().get(timeout=10) == 42


def test_current_rank_through_lambda(counters):
    acc = Accumulator(counters.run, 0, operator.add)
    assert acc.accumulate(lambda: current_rank()["gpus"]).get(timeout=10) == 1


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_gather_calls_on_user_loop(counters, loop_kind):
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()

    async def main():
        return await asyncio.gather(*[counters.echo.call(i) for i in range(10)])

    try:
        results = loop.run_until_complete(asyncio.wait_for(main(), 20))
    finally:
        loop.close()
    assert [vm.values() for vm in results] == [[(i, 0), (i, 1)] for i in range(10)]
