"""A connection dropped by a live peer is re-established, and the calls on it are not lost.

Worker A drops every connection it receives on (as a receiver closing a connection over a bad
frame would). The client does not take A for dead: its next calls reach A over a new
connection. A call that was waiting on A when the connection dropped fails with a clear error
(whether its message arrived cannot be known) instead of waiting forever.
"""

from __future__ import annotations

import asyncio

import pytest
from fault_helpers import Probe

from monarch.actor import concurrent_endpoint, endpoint, this_host


class Dropper(Probe):
    @concurrent_endpoint
    async def never(self) -> None:
        await asyncio.Event().wait()

    @endpoint
    async def drop_incoming(self) -> int:
        from monarch._src.actor.process_state import runtime

        conns = list(runtime()._incoming)
        for conn in conns:
            conn.abort(ConnectionResetError("dropped by the test"))
        return len(conns)


@pytest.mark.timeout(60)
def test_dropped_connection_is_re_established_and_pending_calls_fail():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        a = pm.spawn("a", Dropper)
        assert a.ping.call_one("before").get(timeout=30) == "before"
        pending = a.never.call_one()
        assert a.drop_incoming.call_one().get(timeout=10) >= 1
        with pytest.raises(ConnectionError) as info:
            pending.get(timeout=10)
        message = str(info.value)
        assert "a.never()" in message and "closed" in message and "still alive" in message, message
        assert a.ping.call_one("after").get(timeout=10) == "after"
    finally:
        pm.stop().get(timeout=10)
