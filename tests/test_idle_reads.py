"""A sync actor's thread reads its messages itself while its mailbox is empty
(``runtime/idle_reads``), and the loop reads them while it runs an endpoint: per-sender FIFO,
every message once, and nothing starved, whichever thread reads.

The frames the actor's thread cannot deliver straight to a mailbox (shared memory to map, a
spawn, a stop) go to the loop with every frame after them on their connection: they are sent
here interleaved with plain calls at full rate, where a later call overtaking them would show.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from monarch._src.actor.process_state import runtime
from monarch._src.runtime.idle_reads import POLL_SLICE_S
from monarch.actor import Actor, SupervisionError, endpoint

#: Float64s of a little more than the shared-memory threshold (1 MiB): such an argument travels
#: in a shared-memory file that the loop maps, never on the actor's thread.
SHM_ELEMS = (1 << 20) // 8 + 1


class Log(Actor):
    """Records what it is sent, in the order its thread runs it."""

    def __init__(self, other=None) -> None:
        self.log: list = []
        self.other = other

    @endpoint
    def append(self, item, blob=None) -> int:
        self.log.append(item)
        return len(self.log)

    @endpoint
    def get(self) -> list:
        return list(self.log)

    @endpoint
    def relay(self, i: int) -> int:
        """A blocking call to ``other``: its reply, and ``other``'s wake-up, come meanwhile."""
        self.log.append(i)
        return self.other.append.call_one(i).get(timeout=30)

    @endpoint
    def address(self) -> str:
        return runtime().address

    @endpoint
    def reads_when_idle(self) -> int:
        """How many of its process's connections its thread reads while idle."""
        from monarch._src.actor.context import current_instance

        idle = current_instance.get()._idle
        return 0 if idle is None else len(idle.lent)


class Blocker(Actor):
    @endpoint
    def block(self, fifo: str) -> str:
        """Blocks its thread until the test writes to ``fifo``."""
        with open(fifo) as f:
            return f.read()


@pytest.mark.timeout(120)
def test_frames_left_to_the_loop_keep_their_place_among_direct_calls(procs1) -> None:
    """Shared-memory calls and broadcasts interleaved with plain calls from one sender, at full
    rate: each runs once, in the order sent."""
    log = procs1.spawn("log", Log)
    assert log.append.call_one(-1).get(timeout=30) == 1
    assert log.reads_when_idle.call_one().get(timeout=30) >= 1, "its thread reads the client's connection"
    big = np.ones(SHM_ELEMS)
    n = 400
    futures = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            futures.append(log.append.call_one(i, big))
        elif kind == 1:
            log.append.broadcast(i)
        else:
            futures.append(log.append.call_one(i))
    positions = [f.get(timeout=60) for f in futures]
    assert positions == sorted(positions)
    assert log.get.call_one().get(timeout=30) == [-1, *range(n)]


@pytest.mark.timeout(120)
def test_a_spawn_and_its_messages_while_another_actors_thread_reads(procs1) -> None:
    """Spawns (the loop's) arrive on the connection the first actor's thread reads; the calls
    right behind them find their actor, and the first actor's messages keep their order."""
    first = procs1.spawn("first", Log)
    assert first.append.call_one(-1).get(timeout=30) == 1
    for k in range(4):
        other = procs1.spawn(f"other{k}", Log)
        calls = [other.append.call_one(i) for i in range(200)]
        first.append.broadcast(k)
        assert [f.get(timeout=30) for f in calls] == list(range(1, 201))
    assert first.get.call_one().get(timeout=30) == [-1, 0, 1, 2, 3]


@pytest.mark.timeout(120)
def test_several_actors_of_one_process_called_in_turn(procs1) -> None:
    """Three sync actors of one process, called in turn at full rate on one connection: each
    thread reads it when idle, delivers to the others' mailboxes, and each runs its own calls
    once, in order."""
    actors = [procs1.spawn(f"log{k}", Log) for k in range(3)]
    n = 1500
    futures = [actors[i % 3].append.call_one(i) for i in range(n)]
    assert [f.get(timeout=60) for f in futures] == [i // 3 + 1 for i in range(n)]
    for k, actor in enumerate(actors):
        assert actor.get.call_one().get(timeout=30) == list(range(k, n, 3))


@pytest.mark.timeout(120)
def test_stop_after_calls_runs_after_them(procs1) -> None:
    """A stop (the loop's) right behind calls the actor's thread read: they all run first;
    calls sent after it fail."""
    log = procs1.spawn("log", Log)
    assert log.append.call_one(-1).get(timeout=30) == 1
    calls = [log.append.call_one(i) for i in range(300)]
    stopped = log.stop()
    after = log.append.call_one(300)
    assert [f.get(timeout=30) for f in calls] == list(range(2, 302))
    stopped.get(timeout=30)
    with pytest.raises(SupervisionError):
        after.get(timeout=30)


@pytest.mark.timeout(120)
def test_a_long_endpoint_starves_nothing_in_its_process(procs1, tmp_path: Path) -> None:
    """While one actor's thread runs a long endpoint (it read the call itself), another actor
    of its process answers calls and is stopped: the loop reads what the busy thread would
    have read."""
    fifo = str(tmp_path / "release")
    os.mkfifo(fifo)
    blocker = procs1.spawn("blocker", Blocker)
    log = procs1.spawn("log", Log)
    assert blocker.block.call_one(os.devnull).get(timeout=30) == ""  # its thread reads when idle
    blocked = blocker.block.call_one(fifo)
    assert [log.append.call_one(i).get(timeout=30) for i in range(100)] == list(range(1, 101))
    log.stop().get(timeout=30)
    with open(fifo, "w") as f:
        f.write("released")
    assert blocked.get(timeout=30) == "released"


@pytest.mark.timeout(180)
def test_messages_from_this_process_and_others_wake_an_idle_thread(procs2) -> None:
    """The target's thread waits reading the client's connection; calls from an actor of its
    own process, and from another process, wake it at once (each would otherwise wait for the
    thread's poll to time out: ``POLL_SLICE_S`` each)."""
    target = procs2.slice(gpus=0).spawn("target", Log)
    local = procs2.slice(gpus=0).spawn("local", Log, target)
    remote = procs2.slice(gpus=1).spawn("remote", Log, target)
    assert target.append.call_one(-1).get(timeout=30) == 1
    n = 150
    started = time.monotonic()
    for i in range(n):
        relay = local if i % 2 else remote
        relay.relay.call_one(i).get(timeout=30)
    took = time.monotonic() - started
    assert took < n * POLL_SLICE_S / 4, f"{n} relays took {took:.1f} s: the idle thread was not woken"
    assert target.get.call_one().get(timeout=30) == [-1, *range(n)]


@pytest.mark.timeout(120)
def test_the_sender_dropping_its_connection_loses_nothing_and_runs_nothing_twice(procs1) -> None:
    """The client closes its connection to the worker in the middle of a burst, while the
    actor's thread reads it: the client reconnects, the worker says what it read, and every
    call runs once, in order."""
    log = procs1.spawn("log", Log)
    assert log.append.call_one(-1).get(timeout=30) == 1
    assert log.reads_when_idle.call_one().get(timeout=30) >= 1
    rt = runtime()
    conn = rt._conns[log.address.call_one().get(timeout=30)]
    n = 3000
    futures = [log.append.call_one(i) for i in range(n // 2)]
    futures[0].get(timeout=30)
    rt.loop_thread.call_soon(conn.close)  # (its loop's): the worker reads the end of it
    futures += [log.append.call_one(i) for i in range(n // 2, n)]
    assert [f.get(timeout=60) for f in futures] == list(range(2, n + 2))
    assert log.get.call_one().get(timeout=30) == [-1, *range(n)]
