"""A dropped reply connection fails exactly the calls whose replies it lost.

Each process sends on a connection of its own, so a worker's replies reach the client on the
worker's connection. Here the client drops that connection (as a TCP reset between hosts would).
The worker reconnects at once and says in its hello how many frames it had written on the old
connection, and which of them were replies: a call whose reply the client had not read fails
again on the new connection, as the client says in answer to the hello which frames it read
(a worker that no longer keeps it fails its call with a clear error); a call still running on
the worker completes over the new connection; calls waiting on other workers are untouched, and
later calls work.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import Any

import pytest
from actors import Gate
from fault_helpers import Probe

from monarch._src.runtime.config import configured
from monarch.actor import this_host


def drop_connection_from(address: str, send_first: Callable[[], Any] | None = None) -> Any:
    """Abort the connection the process at ``address`` sends this thread's replies on (to this
    thread's reply address, ``thread_replies``, if it has one; else to the process's own).

    With ``send_first``, the client's loop is held while it sends (from the loop thread, so it
    is written at once, and answered at the process's own address: see ``where_from_the_loop``)
    and the answer arrives: the connection is aborted with that answer unread, so it is lost.
    Returns what ``send_first`` returned, else how many were aborted."""
    from monarch._src.actor.process_state import runtime

    rt = runtime()
    lent = rt.thread_replies.of_this_thread() if send_first is None else None

    async def drop() -> Any:
        incoming = list(lent._readers) if lent is not None else rt._incoming
        conns = [c for c in incoming if c.peer == address]
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


def where_from_the_loop(probe: Any) -> tuple[int, str]:
    """``probe.where`` (a mesh of one actor with ``Probe``'s ``where``) called from the client's runtime loop, so its
    process answers at the client's own address, and has a connection to it from then on (a
    call made on a thread is answered at that thread's reply address instead)."""
    from monarch._src.actor.process_state import runtime

    async def where() -> tuple[int, str]:
        return await probe.where.call_one()

    return runtime().loop_thread.run_sync(where(), timeout=30)


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
def test_a_reply_unread_when_its_connection_drops_is_sent_again():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        probe = pm.spawn("probe", Probe)
        _, address = where_from_the_loop(probe)
        lost = drop_connection_from(address, send_first=lambda: probe.ping.call_one("unread"))
        assert lost.get(timeout=10) == "unread"
        assert probe.ping.call_one("after").get(timeout=10) == "after"
    finally:
        pm.stop().get(timeout=10)


@pytest.mark.timeout(60)
def test_a_call_whose_reply_was_lost_fails_and_one_still_running_completes():
    """The worker keeps no reply to send again: the unread one is lost, and its call fails."""
    with configured(resend_keep_messages=0):
        pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        gate = pm.spawn("gate", Gate)
        probe = pm.spawn("probe", Probe)
        _, address = where_from_the_loop(probe)
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
