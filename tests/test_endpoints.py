"""Endpoint kinds: sync/async, concurrent endpoints, serial dispatch, explicit response ports."""

from __future__ import annotations

import asyncio
import os
import threading

import actors
import pytest

from monarch.actor import (
    Actor,
    ActorError,
    Port,
    as_endpoint,
    concurrent_endpoint,
    endpoint,
    this_proc,
)


class Counter(actors.Counter):
    def plain(self, x: int) -> int:
        return x * 2


class SyncIndirect(Actor):
    """A sync actor blocking on another actor's reply (legal on its own thread)."""

    @endpoint
    def call_value(self, c) -> int:
        return c.value.choose().get(timeout=10)

    @endpoint
    def loop_visible(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True


class AsyncIndirect(Actor):
    @endpoint
    async def call_value(self, c) -> int:
        return await c.value.choose()

    @endpoint
    async def sum_of(self, c) -> int:
        vm = await c.value.call()
        return sum(vm.values())


class Mixed(Actor):
    @endpoint
    def a(self) -> None:
        pass

    @endpoint
    async def b(self) -> None:
        pass


class Clash(Actor):
    @endpoint
    def slice(self) -> None:  # collides with ActorMesh.slice
        pass


class Gate(actors.Gate):
    @concurrent_endpoint
    async def boom(self) -> None:
        raise KeyError("concurrent failure")

    @endpoint
    async def ping(self) -> str:
        return "pong"


class Starts(Actor):
    def __init__(self) -> None:
        self.log: list[str] = []
        self.event = asyncio.Event()

    @concurrent_endpoint
    async def wait(self, i: int) -> int:
        self.log.append(f"start{i}")
        await self.event.wait()
        return i

    @endpoint
    async def get_log(self) -> list:
        return list(self.log)

    @endpoint
    async def release(self) -> None:
        self.event.set()


class Serial(Actor):
    def __init__(self) -> None:
        self.log: list[str] = []

    @endpoint
    async def work(self, i: int) -> int:
        self.log.append(f"start{i}")
        for _ in range(5):  # yield to the loop several times mid-handler
            await asyncio.sleep(0.01)
        self.log.append(f"end{i}")
        return i

    @endpoint
    async def get_log(self) -> list:
        return list(self.log)


class Ported(Actor):
    @endpoint(explicit_response_port=True)
    def add(self, port: Port[int], b: int) -> None:
        port.send(3 + b)

    @endpoint(explicit_response_port=True)
    def refuse(self, port: Port[int], msg: str) -> None:
        port.exception(ValueError(msg))

    @endpoint
    def alive(self) -> bool:
        return True


class InferenceEngine(Actor):
    """Queues requests and answers them later, in an order of its own choosing."""

    def __init__(self) -> None:
        self.pending: dict[int, Port] = {}

    @endpoint(explicit_response_port=True)
    def generate(self, port: Port[str], request_id: int, prompt: str) -> None:
        self.pending[request_id] = (port, prompt)

    @endpoint
    def finish(self, request_id: int) -> int:
        port, prompt = self.pending.pop(request_id)
        port.send(prompt.upper())
        return len(self.pending)


class TLS(Actor):
    def __init__(self) -> None:
        self.local = threading.local()

    @endpoint
    def incr(self) -> int:
        self.local.n = getattr(self.local, "n", 0) + 1
        return self.local.n


def test_sync_actor_blocks_on_another_actor(procs2):
    c = procs2.spawn("counter", Counter, 5)
    ind = procs2.spawn("indirect", SyncIndirect)
    assert ind.slice(gpus=0).call_value.call_one(c).get(timeout=10) == 5


def test_sync_endpoint_has_no_visible_loop(procs1):
    ind = procs1.spawn("indirect", SyncIndirect)
    assert ind.loop_visible.call_one().get(timeout=10) is False


def test_async_actor_awaits_other_calls(procs2):
    c = procs2.spawn("counter", Counter, 4)
    ind = procs2.spawn("aindirect", AsyncIndirect)
    assert ind.slice(gpus=1).call_value.call_one(c).get(timeout=10) == 4
    assert ind.sum_of.call(c).get(timeout=10).values() == [8, 8]


def test_mixed_sync_and_async_endpoints_rejected_at_spawn():
    with pytest.raises(ValueError, match="mixes both async and sync"):
        this_proc().spawn("mixed", Mixed)


def test_endpoint_name_colliding_with_mesh_attribute_rejected():
    with pytest.raises(ValueError, match="collides with an endpoint name"):
        this_proc().spawn("clash", Clash)


def test_concurrent_endpoint_overlaps_with_next_message(procs1):
    gate = procs1.spawn("gate", Gate)
    waiting = gate.wait.call_one()
    assert gate.release.call_one().get(timeout=10) == "released"
    assert waiting.get(timeout=10) == "done"


def test_concurrent_endpoint_exception_is_actor_error_and_actor_survives(procs1):
    gate = procs1.spawn("gate", Gate)
    with pytest.raises(ActorError, match="concurrent failure") as ei:
        gate.boom.call_one().get(timeout=10)
    assert isinstance(ei.value.exception, KeyError)
    assert gate.ping.call_one().get(timeout=10) == "pong"


def test_concurrent_endpoints_start_in_send_order(procs1):
    s = procs1.spawn("starts", Starts)
    futures = [s.wait.call_one(i) for i in range(4)]
    assert s.get_log.call_one().get(timeout=10) == ["start0", "start1", "start2", "start3"]
    assert not any(f.done() for f in futures)
    s.release.broadcast()
    assert [f.get(timeout=10) for f in futures] == [0, 1, 2, 3]


def test_concurrent_endpoint_rejects_sync_method():
    with pytest.raises(ValueError, match="can only wrap async endpoints"):

        class Bad(Actor):
            @concurrent_endpoint
            def f(self) -> None:
                pass


def test_concurrent_endpoint_rejects_stacking_on_endpoint():
    with pytest.raises(ValueError, match="does not wrap @endpoint"):

        class Bad(Actor):
            @concurrent_endpoint
            @endpoint
            async def f(self) -> None:
                pass


def test_concurrent_endpoint_with_options_form():
    class Ok(Actor):
        @concurrent_endpoint(explicit_response_port=True)
        async def f(self, port) -> None:
            port.send(1)

    assert Ok.f.explicit_response_port is True


def test_async_endpoints_run_one_message_at_a_time(procs1):
    s = procs1.spawn("serial", Serial)
    futures = [s.work.call_one(i) for i in range(3)]
    assert [f.get(timeout=10) for f in futures] == [0, 1, 2]
    assert s.get_log.call_one().get(timeout=10) == ["start0", "end0", "start1", "end1", "start2", "end2"]


def test_explicit_response_port_send(procs2):
    p = procs2.spawn("ported", Ported)
    assert p.slice(gpus=0).add.call_one(2).get(timeout=10) == 5
    assert p.add.call(10).get(timeout=10).values() == [13, 13]


def test_explicit_response_port_exception(procs1):
    p = procs1.spawn("ported", Ported)
    with pytest.raises(ValueError, match="refused here"):
        p.refuse.call_one("refused here").get(timeout=10)
    assert p.alive.call_one().get(timeout=10) is True


def test_explicit_response_port_wrong_args_checked_without_port(procs1):
    p = procs1.spawn("ported", Ported)
    with pytest.raises(TypeError):
        p.add.call_one()
    with pytest.raises(TypeError):
        p.add.call_one(1, 2)


def test_out_of_order_replies_through_stored_ports(procs1):
    engine = procs1.spawn("engine", InferenceEngine)
    first = engine.generate.call_one(1, "first")
    second = engine.generate.call_one(2, "second")
    assert engine.finish.call_one(2).get(timeout=10) == 1
    assert second.get(timeout=10) == "SECOND"
    assert not first.done()  # its reply has not been sent yet
    assert engine.finish.call_one(1).get(timeout=10) == 0
    assert first.get(timeout=10) == "FIRST"


def test_thread_locals_persist_across_calls(procs1):
    t = procs1.spawn("tls", TLS)
    assert [t.incr.call_one().get(timeout=10) for _ in range(4)] == [1, 2, 3, 4]


def test_as_endpoint_calls_plain_method(procs1):
    c = procs1.spawn("counter", Counter)
    assert as_endpoint(c.plain).call_one(21).get(timeout=10) == 42
    with pytest.raises(ValueError, match="expected an method of a spawned actor"):
        as_endpoint(c.value)


def test_endpoint_not_called_directly(procs1):
    c = procs1.spawn("counter", Counter)
    with pytest.raises(TypeError):
        c.value()


def test_actor_is_local_to_its_process(procs2):
    c = procs2.spawn("counter", Counter)
    c.slice(gpus=0).incr.broadcast()
    assert c.value.call().get(timeout=10).values() == [1, 0]
    assert os.getpid() not in []  # the client itself holds no state of these actors
