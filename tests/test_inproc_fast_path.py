"""Calls to actors of the caller's own process: immutable values travel without a copy, and
every guarantee of the other paths holds (order across adverbs, copy paths and threads, errors
to the caller and to the owner, stop with calls pending, a sync actor's own thread, awaiting
from any loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import actors
import pytest

import monarch.actor
from monarch.actor import (
    Actor,
    ActorError,
    Channel,
    MeshFailure,
    SupervisionError,
    context,
    endpoint,
    send,
    this_proc,
)

TIMEOUT_S = 15.0


class Echo(Actor):
    def __init__(self) -> None:
        self.log: list = []

    @endpoint
    def echo(self, x: Any = None) -> Any:
        return x

    @endpoint
    def append(self, item: Any) -> int:
        self.log.append(item)
        return len(self.log)

    @endpoint
    def log_so_far(self) -> list:
        return list(self.log)

    @endpoint
    def thread(self) -> int:
        return threading.get_ident()

    @endpoint
    def add_mark(self, items: list) -> list:
        items.append("actor")
        return items

    @endpoint
    def hold(self, gate: Any) -> str:
        """Blocks this actor until the test releases ``gate``."""
        return gate.wait.call_one().get(timeout=TIMEOUT_S)

    @endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    def stop_self_then_hold(self, stopping: Any, gate: Any) -> str:
        context().actor_instance.stop()
        stopping.send("stop queued")
        return gate.wait.call_one().get(timeout=TIMEOUT_S)


class AsyncEcho(Actor):
    @endpoint
    async def echo(self, x: Any = None) -> Any:
        return x

    @endpoint
    async def thread(self) -> int:
        return threading.get_ident()

    @endpoint
    async def relay(self, target: Any, n: int) -> list:
        """Awaits calls to ``target`` from this actor's own loop (the runtime's)."""
        return [await target.echo.call_one(i) for i in range(n)]


@pytest.fixture
def local() -> Iterator[Any]:
    mesh = this_proc().spawn("fast_echo", Echo)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT_S)


@pytest.fixture
def gate() -> Iterator[Any]:
    mesh = this_proc().spawn("fast_gate", actors.Gate)
    yield mesh
    mesh.stop().get(timeout=TIMEOUT_S)


def test_immutable_values_travel_without_a_copy(local: Any) -> None:
    big = bytes(1 << 20)
    nested = (1, 2.5, "text", None, (big, b"small"))
    assert local.echo.call_one(big).get(timeout=TIMEOUT_S) is big
    assert local.echo.call_one(nested).get(timeout=TIMEOUT_S) is nested
    assert local.echo.call_one(x=nested).get(timeout=TIMEOUT_S) is nested


def test_mutable_values_are_still_copied_when_sent(local: Any, gate: Any) -> None:
    held = local.hold.call_one(gate)  # the actor runs nothing else until the gate opens
    items = [1, 2]
    in_tuple = (0, [1])
    marked = local.add_mark.call_one(items)
    echoed = local.echo.call_one(in_tuple)
    items.append("caller")  # after the send: the actor must see the list as it was then
    in_tuple[1].append("caller")
    assert gate.release.call_one().get(timeout=TIMEOUT_S) == "released"
    assert held.get(timeout=TIMEOUT_S) == "done"
    assert marked.get(timeout=TIMEOUT_S) == [1, 2, "actor"]
    assert items == [1, 2, "caller"]  # and the actor's change did not reach the caller's list
    assert echoed.get(timeout=TIMEOUT_S) == (0, [1])


def test_order_kept_across_adverbs_and_copy_paths(local: Any) -> None:
    port, receiver = Channel.open()
    expected, futures = [], []
    for i in range(300):
        kind = i % 6
        item: Any = [i] if kind == 2 else i  # a list is pickled, an int is not
        expected.append(item)
        if kind == 0:
            local.append.broadcast(item)
        elif kind in (1, 2):
            futures.append(local.append.call_one(item))
        elif kind == 3:
            send(local.append, (item,), {}, port=port)
        elif kind == 4:
            futures.append(local.append.choose(item))
        else:
            futures.append(local.append.call(item))
    assert local.log_so_far.call_one().get(timeout=TIMEOUT_S) == expected
    positions = [f.get(timeout=TIMEOUT_S) for f in futures]
    positions = [p if isinstance(p, int) else p.item() for p in positions]
    assert positions == sorted(positions)
    assert [receiver.recv().get(timeout=TIMEOUT_S) for _ in range(50)] == list(range(4, 300, 6))


def test_calls_from_several_threads_at_once(local: Any) -> None:
    n, threads_n = 200, 4
    errors: list[BaseException] = []
    start = threading.Barrier(threads_n)

    def caller(t: int) -> None:
        try:
            start.wait(timeout=TIMEOUT_S)
            for i in range(n):
                item = (t, i) if i % 2 else [t, i]
                assert local.echo.call_one(item).get(timeout=TIMEOUT_S) == item
                local.append.broadcast((t, i))
        except BaseException as e:  # reported below, with the thread's own traceback
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=TIMEOUT_S * 2)
    assert not errors, errors
    log = local.log_so_far.call_one().get(timeout=TIMEOUT_S)
    assert len(log) == n * threads_n
    for t in range(threads_n):
        assert [i for who, i in log if who == t] == list(range(n))


def test_endpoint_exception_reaches_the_caller(local: Any) -> None:
    with pytest.raises(ActorError) as raised:
        local.fail.call_one("bad input").get(timeout=TIMEOUT_S)
    assert isinstance(raised.value.exception, ValueError)
    assert "bad input" in str(raised.value)

    async def awaited() -> None:
        await local.fail.call_one("awaited bad input")

    with pytest.raises(ActorError, match="awaited bad input"):
        asyncio.run(awaited())
    assert local.echo.call_one(7).get(timeout=TIMEOUT_S) == 7  # a caught error fails nothing


def test_broadcast_failure_reaches_the_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    faults: list[MeshFailure] = []
    reported = threading.Event()

    def record(failure: MeshFailure) -> None:
        faults.append(failure)
        reported.set()

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", record)
    mesh = this_proc().spawn("fast_failing", Echo)
    try:
        mesh.fail.broadcast("nobody waits for this")
        assert reported.wait(TIMEOUT_S), "the failure never reached the client's fault hook"
        assert "nobody waits for this" in faults[0].report()
        with pytest.raises(SupervisionError, match="nobody waits for this"):
            mesh.echo.call_one(1).get(timeout=TIMEOUT_S)
    finally:
        mesh.stop().get(timeout=TIMEOUT_S)


def test_stop_with_calls_pending(gate: Any) -> None:
    mesh = this_proc().spawn("fast_stopped", Echo)
    held = mesh.hold.call_one(gate)
    pending = [mesh.echo.call_one(i) for i in range(20)]
    stopped = mesh.stop()
    with pytest.raises(SupervisionError, match="stopped"):
        mesh.echo.call_one("too late").get(timeout=TIMEOUT_S)
    assert gate.release.call_one().get(timeout=TIMEOUT_S) == "released"
    assert held.get(timeout=TIMEOUT_S) == "done"
    assert [f.get(timeout=TIMEOUT_S) for f in pending] == list(range(20))  # drained first
    stopped.get(timeout=TIMEOUT_S)


def test_calls_behind_a_self_stop_are_answered(gate: Any) -> None:
    mesh = this_proc().spawn("fast_self_stop", Echo)
    port, stopping = Channel.open()
    held = mesh.stop_self_then_hold.call_one(port, gate)
    assert stopping.recv().get(timeout=TIMEOUT_S) == "stop queued"
    behind = mesh.echo.call_one("behind the stop")  # queued after the actor's own stop
    assert gate.release.call_one().get(timeout=TIMEOUT_S) == "released"
    assert held.get(timeout=TIMEOUT_S) == "done"
    with pytest.raises(SupervisionError, match="stopped"):
        behind.get(timeout=TIMEOUT_S)
    with pytest.raises(SupervisionError):  # and once it is gone, at once
        mesh.echo.call_one("after the stop").get(timeout=TIMEOUT_S)


def test_sync_endpoints_run_on_the_actors_own_thread(local: Any) -> None:
    loop_actor = this_proc().spawn("fast_loop_thread", AsyncEcho)
    try:
        loop_thread = loop_actor.thread.call_one().get(timeout=TIMEOUT_S)
        by_get = {local.thread.call_one().get(timeout=TIMEOUT_S) for _ in range(20)}

        async def awaited() -> set[int]:
            return {await local.thread.call_one() for _ in range(20)}

        by_await = asyncio.run(awaited())
        assert len(by_get) == 1 and by_get == by_await
        assert by_get.isdisjoint({threading.get_ident(), loop_thread})
    finally:
        loop_actor.stop().get(timeout=TIMEOUT_S)


def test_await_from_foreign_loops(local: Any) -> None:
    async_local = this_proc().spawn("fast_async_echo", AsyncEcho)
    results: dict[str, list] = {}

    async def calls(name: str, target: Any) -> None:
        results[name] = [await target.echo.call_one((name, i)) for i in range(100)]

    def in_thread(name: str, target: Any) -> None:
        asyncio.run(calls(name, target))

    try:
        others = [
            threading.Thread(target=in_thread, args=(f"thread-{kind}", target))
            for kind, target in (("sync", local), ("async", async_local))
        ]
        for th in others:
            th.start()
        asyncio.run(calls("main-sync", local))
        asyncio.run(calls("main-async", async_local))
        for th in others:
            th.join(timeout=TIMEOUT_S * 2)
        assert set(results) == {"thread-sync", "thread-async", "main-sync", "main-async"}
        for name, got in results.items():
            assert got == [(name, i) for i in range(100)]
    finally:
        async_local.stop().get(timeout=TIMEOUT_S)


def test_await_from_an_actors_own_loop(local: Any) -> None:
    relay = this_proc().spawn("fast_relay", AsyncEcho)
    async_local = this_proc().spawn("fast_relayed", AsyncEcho)
    try:
        assert relay.relay.call_one(local, 50).get(timeout=TIMEOUT_S) == list(range(50))
        assert relay.relay.call_one(async_local, 50).get(timeout=TIMEOUT_S) == list(range(50))
    finally:
        relay.stop().get(timeout=TIMEOUT_S)
        async_local.stop().get(timeout=TIMEOUT_S)
