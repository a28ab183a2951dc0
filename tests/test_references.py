"""Meshes, ports and ValueMeshes as endpoint arguments and results."""

from __future__ import annotations

import os

import actors

from monarch.actor import Actor, Channel, Port, ProcMesh, endpoint


class Counter(actors.Counter):
    @endpoint
    def whoami(self) -> tuple:
        return (os.getpid(), self.v)


class Caller(Actor):
    @endpoint
    def fetch(self, to) -> list:
        return [f.get(timeout=10) for f in to.whoami.stream()]

    @endpoint
    def bump_and_read(self, to) -> list:
        to.incr.broadcast()
        return to.value.call().get(timeout=10).values()

    @endpoint
    def make_counter(self, start: int):
        from monarch.actor import this_proc

        return this_proc().spawn("made", Counter, start)

    @endpoint
    def spawn_on(self, procs: ProcMesh, start: int) -> list:
        made = procs.spawn("remote_made", Counter, start)
        made.incr.broadcast()
        return made.whoami.call().get(timeout=10).values()

    @endpoint
    def send_range(self, port: Port[int], n: int) -> None:
        for i in range(n):
            port.send(i)

    @endpoint
    def value_mesh_items(self, c) -> list:
        return list(c.value.call().get(timeout=10))


def test_mesh_passed_to_actor_which_calls_it(procs2):
    counters = procs2.spawn("counters", Counter, 3)
    caller = procs2.spawn("caller", Caller)
    pids = counters.whoami.call().get(timeout=10).values()
    results = [y for f in caller.fetch.stream(counters) for y in f.get(timeout=10)]
    assert len(results) == 4
    assert sorted(results) == sorted(pids * 2)


def test_mesh_passed_across_proc_meshes(procs1, procs2):
    counters = procs2.spawn("counters", Counter)
    caller = procs1.spawn("caller", Caller)
    assert caller.bump_and_read.call_one(counters).get(timeout=10) == [1, 1]
    # The caller's broadcast reached the very actors the client talks to.
    assert counters.value.call().get(timeout=10).values() == [1, 1]


def test_sliced_mesh_passed_to_actor(procs2):
    counters = procs2.spawn("counters", Counter)
    caller = procs2.spawn("caller", Caller)
    one = counters.slice(gpus=0)
    a, b = caller.fetch.call(one).get(timeout=10).values()
    assert a == b and len(a) == 1
    assert a[0][0] == counters.slice(gpus=0).whoami.call_one().get(timeout=10)[0]


def test_mesh_returned_from_endpoint_is_callable(procs1):
    caller = procs1.spawn("caller", Caller)
    made = caller.make_counter.call_one(41).get(timeout=10)
    made.incr.broadcast()
    assert made.value.call_one().get(timeout=10) == 42
    caller_pid = caller.fetch.call_one(made).get(timeout=10)[0][0]
    assert made.whoami.call_one().get(timeout=10)[0] == caller_pid != os.getpid()


def test_port_passed_to_actor_delivers_in_order(procs1):
    caller = procs1.spawn("caller", Caller)
    port, receiver = Channel.open()
    caller.send_range.broadcast(port, 100)
    assert [receiver.recv().get(timeout=10) for _ in range(100)] == list(range(100))


def test_ranked_port_fan_in(procs2):
    caller = procs2.spawn("caller", Caller)
    port, receiver = Channel.open_ranked()
    caller.send_range.broadcast(port, 3)
    got = [receiver.recv().get(timeout=10) for _ in range(6)]
    assert sorted(v for _, v in got) == [0, 0, 1, 1, 2, 2]


def test_proc_mesh_passed_to_actor_which_spawns_on_it(procs1, procs2):
    caller = procs1.spawn("caller", Caller)
    pids = procs2.spawn("probe", Counter).whoami.call().get(timeout=10).values()
    remote = caller.spawn_on.call_one(procs2, 10).get(timeout=10)
    assert sorted(remote) == sorted((pid, 11) for pid, _ in pids)


def test_value_mesh_items_equal_after_pickling(procs2):
    counters = procs2.spawn("counters", Counter, 5)
    caller = procs2.spawn("caller", Caller)
    local = list(counters.value.call().get(timeout=10))
    remote = caller.slice(gpus=1).value_mesh_items.call_one(counters).get(timeout=10)
    assert remote == local
