"""A connection dropped by a live peer is re-established, and the calls on it are not lost.

Worker A drops every connection it receives on (as a receiver closing a connection over a bad
frame would). The client does not take A for dead: its next calls reach A over a new
connection. A call that was waiting on A when the connection dropped is not failed: A says, in
answer to the new connection's hello, that it read its message (a message it had not read would
be sent again).
"""

from __future__ import annotations

import pytest
from actors import Gate
from fault_helpers import Probe

from monarch.actor import endpoint, this_host


class Dropper(Gate, Probe):
    @endpoint
    async def drop_incoming(self) -> int:
        from monarch._src.actor.process_state import runtime

        conns = list(runtime()._incoming)
        for conn in conns:
            conn.abort(ConnectionResetError("dropped by the test"))
        return len(conns)


@pytest.mark.timeout(60)
def test_dropped_connection_is_re_established_and_pending_calls_complete():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        a = pm.spawn("a", Dropper)
        assert a.ping.call_one("before").get(timeout=30) == "before"
        pending = a.wait.call_one()
        assert a.drop_incoming.call_one().get(timeout=10) >= 1
        assert a.ping.call_one("after").get(timeout=10) == "after"
        assert a.release.call_one().get(timeout=10) == "released"
        assert pending.get(timeout=10) == "done"
    finally:
        pm.stop().get(timeout=10)
