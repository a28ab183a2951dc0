"""A dropped reply connection fails exactly the calls whose replies it lost.

Each process sends on a connection of its own, so a worker's replies reach the client on the
worker's connection. Here the client drops that connection (as a TCP reset between hosts would).
The worker reconnects at once and says in its hello how many frames it had written on the old
connection, and which of them were replies: a call whose reply the client had not read fails
with a clear error; a call still running on the worker completes over the new connection; calls
waiting on other workers are untouched, and later calls work.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

import pytest
from actors import Gate
from fault_helpers import Probe

from monarch.actor import this_host


def drop_connection_from(address: str, send_first: Callable[[], Any] | None = None) -> Any:
    """Abort the connection the process at ``address`` sends to this (client) process on.

    With ``send_first``, the client's loop is held while it sends (from the loop thread, so it
    is written at once) and the answer arrives: the connection is aborted with that answer
    unread, so it is lost. Returns what ``send_first`` returned, else how many were aborted."""
    from monarch._src.actor.process_state import runtime

    rt = runtime()

    async def drop() -> Any:
        conns = [c for c in rt._incoming if c.peer == address]
        result: Any = len(conns)
        if send_first is not None:
            (conn,) = conns
            result = send_first()
            rt._conns[address].write_corked()  # in case it was corked behind an earlier frame
            sock = conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
            readable, _, _ = select.select([sock.fileno()], [], [], 10)
            assert readable, "the answer never arrived"
        for conn in conns:
            conn.abort(ConnectionResetError("dropped by the test"))
        return result

    return rt.loop_thread.run_sync(drop(), timeout=20)


@pytest.mark.timeout(60)
def test_calls_still_running_when_the_reply_connection_drops_complete():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        gates = pm.spawn("gate", Gate)
        dropped, other = gates.slice(gpus=0), gates.slice(gpus=1)
        probe = pm.spawn("probe", Probe).slice(gpus=0)
        _, address = probe.where.call_one().get(timeout=30)
        running = dropped.wait.call_one()
        untouched = other.wait.call_one()

        assert drop_connection_from(address) == 1
        assert probe.ping.call_one("after").get(timeout=10) == "after"  # over the new connection
        assert dropped.release.call_one().get(timeout=10) == "released"
        assert running.get(timeout=10) == "done"
        other.release.call_one().get(timeout=10)
        assert untouched.get(timeout=10) == "done"
    finally:
        pm.stop().get(timeout=10)


@pytest.mark.timeout(60)
def test_a_call_whose_reply_was_lost_fails_and_one_still_running_completes():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        gate = pm.spawn("gate", Gate)
        probe = pm.spawn("probe", Probe)
        _, address = probe.where.call_one().get(timeout=30)
        running = gate.wait.call_one()

        start = time.monotonic()
        lost = drop_connection_from(address, send_first=lambda: probe.ping.call_one("lost"))
        with pytest.raises(ConnectionError) as info:
            lost.get(timeout=10)
        detected = time.monotonic() - start
        message = str(info.value)
        for part in ("probe.ping()", f"connection from {address} closed", "reply", "still alive", "HINT:"):
            assert part in message, message
        assert detected < 5, detected

        assert gate.release.call_one().get(timeout=10) == "released"
        assert running.get(timeout=10) == "done"
        assert probe.ping.call_one("after").get(timeout=10) == "after"
    finally:
        pm.stop().get(timeout=10)
