"""``async with`` a mesh of agent hosts, and ``spawn_procs`` in it, never block the caller's loop.

Entering awaits the hosts' attachment; ``spawn_procs`` called from the coroutine starts the
procs on sockets each host's session bound ahead, without waiting for its answer; leaving
awaits the shutdown. A task of the same loop keeps ticking throughout, and no blocking
``Future.get()`` is warned about.
"""

from __future__ import annotations

import asyncio
import warnings

import pytest
from actors import Pid
from helpers import record_loop_gaps, wait_gone

from monarch._src.actor import future as future_module
from monarch.actor import hosts_from_config

#: The longest a tick of the loop may be held up (the machine may be loaded); attaching two
#: hosts takes well over a second, so a blocked loop shows.
MAX_GAP_S = 0.5


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_async_with_hosts_and_spawn_procs_keep_the_loop_responsive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(future_module, "_warned_in_loop", False)  # it warns once per process
    monkeypatch.setenv("MONARCH_TEST_HOSTS", "local:2")
    gaps: list[float] = []
    ticker = asyncio.ensure_future(record_loop_gaps(gaps))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with hosts_from_config("MONARCH_TEST_HOSTS") as hosts:
                ticks_while_attaching = len(gaps)
                procs = hosts.spawn_procs(per_host={"gpus": 2})
                pids = list((await procs.spawn("pid", Pid).pid.call()).values())
                assert len(set(pids)) == 4
                ticks_before_shutdown = len(gaps)
        ticks_while_shutting_down = len(gaps) - ticks_before_shutdown
    finally:
        ticker.cancel()
    blocking = [str(w.message) for w in caught if "Future.get()" in str(w.message)]
    assert blocking == []
    assert ticks_while_attaching > 0 and ticks_while_shutting_down > 0
    assert max(gaps) < MAX_GAP_S, max(gaps)
    assert wait_gone(pids) == []


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_procs_a_host_could_not_start_from_a_coroutine_are_reported_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import monarch.actor
    from monarch.actor import SupervisionError

    faults: list[object] = []
    reported = asyncio.Event()
    loop = asyncio.get_running_loop()

    def hook(failure: object) -> None:  # the owner's report may come after the call's error
        faults.append(failure)
        loop.call_soon_threadsafe(reported.set)

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", hook)
    monkeypatch.setenv("MONARCH_TEST_HOSTS", "local:1")
    async with hosts_from_config("MONARCH_TEST_HOSTS") as hosts:
        (host,) = hosts._hosts
        host.spare[0] = "unix:/nonexistent/spare.sock"  # a socket its session never bound
        procs = hosts.spawn_procs()
        with pytest.raises(SupervisionError, match="could not be started on the host of agent"):
            await procs.spawn("pid", Pid).pid.call_one()
        await asyncio.wait_for(reported.wait(), timeout=10)
        assert "could not be started" in str(faults[0])
        assert await hosts.spawn_procs().spawn("pid", Pid).pid.call_one() > 0  # other spares serve
