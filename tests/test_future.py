"""monarch.actor.Future: get, await, timeouts, result/exception, foreign event loops."""

from __future__ import annotations

import asyncio
import math
import threading

import actors
import pytest

from monarch.actor import ActorError, Future, endpoint, this_proc


class Gate(actors.Gate):
    @endpoint
    async def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @endpoint
    async def value(self) -> int:
        return 11

    @endpoint
    async def blocking_get(self, other) -> int:
        # On the actor's event loop: blocking here would deadlock, so get() must refuse.
        return other.value.call_one().get()


@pytest.fixture
def gate(procs1):
    return procs1.spawn("gate", Gate)


def test_future_cannot_be_constructed():
    with pytest.raises(TypeError, match="cannot be constructed directly"):
        Future()


def test_get_is_repeatable(gate):
    f = gate.value.call_one()
    assert f.get(timeout=10) == 11
    assert f.get() == 11
    assert f.result() == 11
    assert f.exception() is None


def test_get_timeout_does_not_cancel(gate):
    f = gate.wait.call_one()
    with pytest.raises(TimeoutError):
        f.get(timeout=0.05)
    assert not f.done()
    assert gate.release.call_one().get(timeout=10) == "released"
    assert f.get(timeout=10) == "done"


def test_result_and_exception_with_timeout(gate):
    f = gate.wait.call_one()
    with pytest.raises(TimeoutError):
        f.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        f.exception(timeout=0.01)
    gate.release.call_one().get(timeout=10)
    assert f.exception(timeout=10) is None
    assert f.result(timeout=10) == "done"


def test_failed_future_reraises_same_exception(gate):
    f = gate.fail.call_one("boom")
    with pytest.raises(ActorError) as first:
        f.get(timeout=10)
    with pytest.raises(ActorError) as second:
        f.get()
    assert first.value is second.value
    exc = f.exception()
    assert exc is first.value
    assert isinstance(exc.exception, ValueError)


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf, "1"])
def test_invalid_timeout_is_value_error(gate, bad):
    f = gate.value.call_one()
    with pytest.raises(ValueError):
        f.get(timeout=bad)
    assert f.get(timeout=10) == 11


async def test_await_then_get_then_await(gate):
    f = gate.value.call_one()
    assert await f == 11
    assert await f == 11
    assert f.get() == 11


async def test_get_then_await(gate):
    f = gate.value.call_one()
    # Block on a worker thread so this test's event loop is not the one blocked.
    assert await asyncio.get_running_loop().run_in_executor(None, f.get, 10) == 11
    assert await f == 11


async def test_await_pending_future_and_failed_future(gate):
    waiting = gate.wait.call_one()
    gate.release.broadcast()
    assert await asyncio.wait_for(waiting, 10) == "done"
    with pytest.raises(ActorError, match="bad input"):
        await gate.fail.call_one("bad input")


async def test_cancelling_one_awaiter_does_not_cancel_the_call(gate):
    f = gate.wait.call_one()
    task = asyncio.ensure_future(f)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await gate.release.call_one()) == "released"
    assert await asyncio.wait_for(f, 10) == "done"


def test_as_asyncio_needs_a_running_loop(gate):
    f = gate.value.call_one()
    with pytest.raises(RuntimeError):
        f.as_asyncio()
    assert f.get(timeout=10) == 11


async def test_as_asyncio_is_non_consuming(gate):
    f = gate.value.call_one()
    a, b = f.as_asyncio(), f.as_asyncio()
    assert a is not b
    assert await a == 11 and await b == 11
    assert f.get() == 11


def test_await_without_running_loop_is_value_error(gate):
    f = gate.wait.call_one()
    try:
        with pytest.raises(ValueError, match="no active event loop"):
            f.__await__().send(None)
    finally:
        gate.release.call_one().get(timeout=10)
        f.get(timeout=10)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_await_from_separate_user_loop_thread(gate, loop_kind):
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        new_loop = uvloop.new_event_loop
    else:
        new_loop = asyncio.new_event_loop
    f = gate.wait.call_one()
    started = threading.Event()
    out: dict = {}

    async def waiter():
        started.set()
        return await asyncio.wait_for(f, 10)

    def thread_main():
        loop = new_loop()
        try:
            out["value"] = loop.run_until_complete(waiter())
        except BaseException as e:  # reported below
            out["error"] = e
        finally:
            loop.close()

    t = threading.Thread(target=thread_main)
    t.start()
    assert started.wait(10)
    gate.release.call_one().get(timeout=10)
    t.join(15)
    assert not t.is_alive()
    assert out == {"value": "done"}


def test_get_inside_async_endpoint_is_refused(gate):
    other = this_proc().spawn("other_gate", Gate)
    try:
        with pytest.raises(ActorError) as ei:
            gate.blocking_get.call_one(other).get(timeout=10)
        assert isinstance(ei.value.exception, RuntimeError)
        assert "await" in str(ei.value.exception)
        # The actor survives.
        assert gate.value.call_one().get(timeout=10) == 11
    finally:
        other.stop().get(timeout=10)
