"""A reply lost on a dropped connection fails its call instead of leaving it waiting forever.

Each process sends on a connection of its own, so a worker's replies reach the client on the
worker's connection. Here the client drops that connection (as a TCP reset between hosts would)
while a call to the worker waits for its reply: the worker reconnects, but the client cannot know
whether the reply was on the lost connection. The call then fails with a clear error, calls
waiting on other workers are untouched, and later calls to the worker work.
"""

from __future__ import annotations

import time

import pytest
from actors import Gate
from fault_helpers import Probe

from monarch.actor import this_host


def drop_connection_from(address: str) -> int:
    """Abort the connections the process at ``address`` sends to this (client) process on."""
    from monarch._src.actor.process_state import runtime

    rt = runtime()

    async def drop() -> int:
        conns = [c for c in rt._incoming if getattr(c, "peer", None) == address]
        for conn in conns:
            conn.abort(ConnectionResetError("dropped by the test"))
        return len(conns)

    return rt.loop_thread.run_sync(drop(), timeout=10)


@pytest.mark.timeout(60)
def test_call_whose_reply_connection_dropped_fails_and_later_calls_work():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        gates = pm.spawn("gate", Gate)
        dropped, other = gates.slice(gpus=0), gates.slice(gpus=1)
        probe = pm.spawn("probe", Probe).slice(gpus=0)
        _, address = probe.where.call_one().get(timeout=30)
        pending = dropped.wait.call_one()
        untouched = other.wait.call_one()

        start = time.monotonic()
        assert drop_connection_from(address) == 1
        with pytest.raises(ConnectionError) as info:
            pending.get(timeout=10)
        detected = time.monotonic() - start
        message = str(info.value)
        for part in ("gate.wait()", f"connection from {address} closed", "reply", "still alive", "HINT:"):
            assert part in message, message
        assert detected < 5, detected

        assert probe.ping.call_one("after").get(timeout=10) == "after"
        assert dropped.release.call_one().get(timeout=10) == "released"
        other.release.call_one().get(timeout=10)
        assert untouched.get(timeout=10) == "done"
    finally:
        pm.stop().get(timeout=10)
