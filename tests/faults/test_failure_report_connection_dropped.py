"""A failure report lost with a dropped connection still reaches the owner.

A broadcast that fails is reported to the mesh's owner on the worker's own connection to it,
and nobody waits for it otherwise. Here the client (the owner) drops that connection with the
report unread, as a TCP reset between hosts would: the worker reconnects at once and its
hello carries the report again, so ``unhandled_fault_hook`` still hears of the failure.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fault_helpers import Probe
from helpers import wait_until
from test_reply_connection_dropped import drop_connection_from, where_from_the_loop

import monarch.actor
from monarch.actor import endpoint, this_host


class Failing(Probe):
    @endpoint
    async def fail(self) -> None:
        raise ValueError("the broadcast failed")


@pytest.mark.timeout(60)
def test_a_broadcast_failure_report_lost_with_the_connection_reaches_the_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults: list[Any] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    pm = this_host().spawn_procs()
    try:
        failing = pm.spawn("failing", Failing)
        _, address = where_from_the_loop(failing)

        start = time.monotonic()
        drop_connection_from(address, send_first=failing.fail.broadcast)
        wait_until(lambda: faults, timeout=10, what="the failure report")
        detected = time.monotonic() - start
        assert "the broadcast failed" in faults[0].report(), faults[0].report()
        assert len(faults) == 1
        assert detected < 5, detected
    finally:
        pm.stop().get(timeout=10)
