"""Sending a mesh of agent hosts that is still attaching, from a coroutine, never blocks its
loop: it raises at once, saying what to await first; once attached, it is sent as a reference
and the receiving actor sees the same hosts."""

from __future__ import annotations

import asyncio

import pytest
from helpers import record_loop_gaps

from monarch.actor import Actor, endpoint, hosts_from_config, this_host

#: The longest a tick of the loop may be held up (the machine may be loaded); attaching a host
#: starts its agent, which takes well over a second, so a loop blocked on it shows.
MAX_GAP_S = 0.5


class Holder(Actor):
    @endpoint
    async def agents(self, hosts: object) -> list[str]:
        return hosts.agent_addresses  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_sending_hosts_still_attaching_from_a_coroutine_raises_without_blocking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MONARCH_TEST_HOSTS", "local:1")
    procs = this_host().spawn_procs()
    holder = procs.spawn("holder", Holder)
    await holder.initialized
    gaps: list[float] = []

    ticker = asyncio.ensure_future(record_loop_gaps(gaps))
    hosts = hosts_from_config("MONARCH_TEST_HOSTS")
    try:
        await asyncio.sleep(0)  # the ticker starts, so that a blocked loop shows in its first gap
        with pytest.raises(RuntimeError, match="still attaching") as info:
            await holder.agents.call_one(hosts)
        assert "HINT: `await host_mesh.initialized`" in str(info.value)
        assert not hosts.initialized.done()  # it did not wait for the attachment
        await hosts.initialized
        assert await holder.agents.call_one(hosts) == hosts.agent_addresses
    finally:
        ticker.cancel()
        await hosts.shutdown()
        await procs.stop()
    assert gaps and max(gaps) < MAX_GAP_S, max(gaps)
