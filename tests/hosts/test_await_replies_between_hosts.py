"""Awaited calls through tree multicast (2 hosts x 2 procs, ``local:2``): the replies each host
gathers into one frame come to the awaiting loop's own reply address and are read there, and a
failing rank still fails the awaited call at once."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from actors import Pid
from test_await_replies import runtime_loop_held

from monarch.actor import ActorError, endpoint

pytestmark = pytest.mark.timeout(90)


class FailOn(Pid):
    @endpoint
    def fail_on(self, pid: int) -> int:
        if os.getpid() == pid:
            raise ValueError("boom on the chosen rank")
        return os.getpid()


def test_gathered_replies_through_forwarders_are_read_by_the_awaiting_loop(hosts2: Any) -> None:
    procs = hosts2.spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("fail_on", FailOn)

    async def main() -> None:
        # The forwarders (gathered replies) and the procs (streamed ones) reach this loop's address.
        pids = sorted((await mesh.pid.call()).values())
        assert len(set(pids)) == 4
        assert sorted(await asyncio.gather(*mesh.pid.stream())) == pids
        with runtime_loop_held():
            assert sorted((await asyncio.wait_for(mesh.pid.call(), 3)).values()) == pids
            assert sorted(await asyncio.gather(*(asyncio.wait_for(f, 3) for f in mesh.pid.stream()))) == pids
        victim = pids[3]
        with pytest.raises(ActorError, match="boom on the chosen rank"):
            await asyncio.wait_for(mesh.fail_on.call(victim), 20)

    asyncio.run(main())
