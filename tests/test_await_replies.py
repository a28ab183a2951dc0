"""Replies to calls awaited on a loop of the user's own are read by that loop (loop_replies).

The check that the awaiting loop reads its replies itself: the runtime's loop thread is held
busy while the call is awaited, and the call still completes. Then the guarantees on that path:
many awaits at once, two loops on two threads at once, a loop that ends (or blocks in
``get()``) with calls pending, a failed rank, a dead process, a timeout, a cancelled task.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import warnings

import pytest
import uvloop
from actors import Gate, Pid
from helpers import drop_reply_connection, runtime_loop_held

from monarch._src.actor import port
from monarch._src.actor.process_state import runtime
from monarch.actor import Actor, ActorError, SupervisionError, endpoint, this_host, this_proc


class AsyncEcho(Actor):
    @endpoint
    async def echo(self, x: object) -> object:
        return x

    @endpoint
    async def fail_on(self, rank: int) -> int:
        from monarch.actor import current_rank

        me = current_rank().rank
        if me == rank:
            raise ValueError(f"rank {me} fails")
        return me


def open_ports() -> int:
    return len(port._handlers)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("run", ["asyncio", "uvloop"])
def test_awaited_reply_is_read_by_the_awaiting_loop(procs2, run):
    echo = procs2.spawn("echo", AsyncEcho)
    one = echo.slice(gpus=0)

    async def main() -> list:
        await echo.echo.call("warm")  # the workers connect to this loop's address
        with runtime_loop_held():
            single = await asyncio.wait_for(one.echo.call_one(1), 10)
            gathered = await asyncio.wait_for(echo.echo.call(2), 10)
            many = await asyncio.wait_for(asyncio.gather(*(one.echo.call_one(i) for i in range(200))), 10)
        return [single, list(gathered.values()), many]

    single, gathered, many = asyncio.run(main()) if run == "asyncio" else uvloop.run(main())
    assert single == 1
    assert gathered == [2, 2]
    assert many == list(range(200))


@pytest.mark.timeout(60)
def test_two_loops_on_two_threads_await_at_once(procs2):
    echo = procs2.spawn("echo", AsyncEcho)
    results: dict[int, object] = {}
    warm = threading.Barrier(3, timeout=20)
    done = threading.Barrier(3, timeout=20)

    def thread_main(t: int) -> None:
        async def main() -> list:
            await echo.echo.call(0)  # both workers reach this loop's address
            warm.wait()  # then the runtime's loop is held until both threads are done
            return [await echo.slice(gpus=t).echo.call_one(t * 1000 + i) for i in range(100)]

        try:
            results[t] = asyncio.run(main())
        except BaseException as e:  # reported by the assertion below
            results[t] = e
        finally:
            done.wait()

    threads = [threading.Thread(target=thread_main, args=(t,)) for t in (0, 1)]
    for th in threads:
        th.start()
    warm.wait()
    with runtime_loop_held():
        done.wait()
    for th in threads:
        th.join(30)
    assert results == {t: [t * 1000 + i for i in range(100)] for t in (0, 1)}


@pytest.mark.timeout(60)
def test_call_pending_when_its_loop_ends_still_gets_its_reply(procs1):
    gate = procs1.spawn("gate", Gate)
    pids = procs1.spawn("pid", Pid)

    async def start() -> object:
        await pids.pid.call_one()  # the worker connects to this loop's address first
        return gate.wait.call_one()

    pending = asyncio.run(start())  # the loop ends with the call pending
    gate.release.call_one().get(timeout=10)  # only now is its reply sent
    assert pending.get(timeout=10) == "done"

    # A loop closed without shutting down its async generators, and one left idle.
    for close in (True, False):
        loop = asyncio.new_event_loop()
        gate3 = procs1.spawn(f"gate3{close}", Gate)
        try:
            fut = loop.run_until_complete(_call_in_loop(gate3))
        finally:
            if close:
                loop.close()
        gate3.release.call_one().get(timeout=10)
        assert fut.get(timeout=10) == "done"
        if not close:
            loop.close()


@pytest.mark.timeout(60)
def test_loop_blocked_in_a_join_does_not_keep_its_replies_from_other_threads(procs1):
    gate = procs1.spawn("gate", Gate)

    async def main() -> object:
        await gate.release.call_one()  # the worker reaches this loop's address
        fresh = procs1.spawn("fresh", Gate)
        pending = fresh.wait.call_one()
        got: list = []

        def other_thread() -> None:
            fresh.release.call_one().get(timeout=10)
            got.append(pending.get(timeout=10))

        t = threading.Thread(target=other_thread)
        t.start()
        t.join(20)  # this loop's thread blocks, not in Future.get()
        return got

    assert asyncio.run(main()) == ["done"]


@pytest.mark.timeout(60)
def test_dropped_reply_connection_keeps_running_calls_and_later_calls_work(procs1):
    gate = procs1.spawn("gate", Gate)
    pids = procs1.spawn("pid", Pid)

    async def main() -> None:
        pid = await pids.pid.call_one()  # the worker connects to this loop's address
        pending = gate.wait.call_one()
        # No reply was lost: the call still running completes over the new connection.
        drop_reply_connection(runtime().loop_replies._lent[asyncio.get_running_loop()], "this loop's address")
        assert await asyncio.wait_for(gate.release.call_one(), 10) == "released"
        assert await asyncio.wait_for(pending, 10) == "done"
        assert await asyncio.wait_for(pids.pid.call_one(), 10) == pid

    asyncio.run(main())


async def _call_in_loop(gate: object) -> object:
    return gate.wait.call_one()  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_get_on_the_loop_that_reads_the_replies_does_not_deadlock():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        echo = pm.spawn("echo", AsyncEcho)

        async def main() -> list:
            # The first contact with this loop's address, and later ones, waited for with the
            # loop blocked in get(): the runtime's loop reads for it meanwhile. (get() warns
            # once per process that it blocks the loop; not what this test is about.)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                first = echo.echo.call_one("first").get(timeout=10)
                second = echo.echo.call_one("second").get(timeout=10)
            return [first, second, await echo.echo.call_one("third")]

        assert asyncio.run(main()) == ["first", "second", "third"]
    finally:
        pm.stop().get(timeout=10)


@pytest.mark.timeout(60)
def test_gather_with_a_failing_rank_fails_at_once(procs2):
    echo = procs2.spawn("echo", AsyncEcho)

    async def main() -> None:
        await echo.echo.call(0)
        with pytest.raises(ActorError, match="rank 1 fails"):
            await asyncio.wait_for(echo.fail_on.call(1), 10)
        values = await echo.fail_on.call(5)  # no rank 5: every rank answers
        assert sorted(values.values()) == [0, 1]

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_dead_process_fails_the_pending_awaits(gates2):
    mesh, gates, pids, faults = gates2

    async def main() -> None:
        victim = (await pids.pid.call()).values()[1]  # both workers reach this loop's address
        pending = [gates.slice(gpus=1).wait.call_one(), gates.wait.call()]
        os.kill(victim, signal.SIGKILL)
        for fut in pending:
            with pytest.raises(SupervisionError):
                await asyncio.wait_for(fut, 10)

    asyncio.run(main())
    with contextlib.suppress(Exception):
        mesh.stop().get(timeout=10)
    assert faults  # the owner heard of it too


@pytest.mark.timeout(60)
def test_timeout_and_cancellation_leave_no_port_open(procs1):
    gate = procs1.spawn("gate", Gate)

    async def main() -> None:
        await gate.release.call_one()
        fresh = procs1.spawn("fresh", Gate)
        before = open_ports()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(fresh.wait.call_one(), 0.2)
        task = asyncio.ensure_future(_await(fresh.wait.call_one()))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert open_ports() == before + 2  # both calls still wait for their replies
        await fresh.release.call_one()
        await fresh.wait.call_one()  # ordered after the two replies on one connection
        assert open_ports() == before

    asyncio.run(main())


async def _await(fut: object) -> object:
    return await fut  # type: ignore[misc]


@pytest.mark.timeout(60)
def test_in_process_actor_and_runtime_loop_keep_their_paths(procs1):
    local = this_proc().spawn("local_echo", AsyncEcho)
    remote = procs1.spawn("echo", AsyncEcho)
    rt = runtime()

    async def main() -> list:
        return [await local.echo.call_one("here"), await remote.echo.call_one("there")]

    assert asyncio.run(main()) == ["here", "there"]
    # A reply to this process never travels over a socket to itself.
    assert not set(rt.frames_sent()) & rt.loop_replies.addresses
    assert rt.loop not in rt.loop_replies._lent


@pytest.mark.timeout(60)
def test_one_future_awaited_by_two_tasks_and_again_after_a_cancelled_await(procs1):
    """The first await of a future is resolved by the future itself, any other by a callback:
    every awaiter gets the reply, and one cancelled before it does not keep it from a later one."""
    gate = procs1.spawn("gate", Gate)

    async def main() -> list:
        first = gate.wait.call_one()
        cancelled = asyncio.ensure_future(_await(first))
        await asyncio.sleep(0)  # it awaits the future now
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        second = gate.wait.call_one()
        both = asyncio.gather(_await(second), _await(second))
        await gate.release.call_one()
        return [await asyncio.wait_for(_await(first), 10), *await asyncio.wait_for(both, 10)]

    assert asyncio.run(main()) == ["done", "done", "done"]
