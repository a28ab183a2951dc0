"""A message over the receiver's MONARCH_MAX_FRAME_BYTES fails at its sender, and only it.

The receiver reads the header of the oversized frame (after the handshake), skips its body and
answers the reply port with the error naming the limit; the connection stays up, so the calls
sent behind it on the same connection all complete, in order.
"""

from __future__ import annotations

import threading

import pytest
from fault_helpers import Probe, probe_worker

import monarch.actor
from monarch.actor import this_host

LIMIT = 200_000
SMALL_LIMIT_ENV = {"MONARCH_MAX_FRAME_BYTES": str(LIMIT)}


@pytest.mark.timeout(60)
def test_oversize_call_fails_and_the_200_calls_behind_it_complete():
    with probe_worker(SMALL_LIMIT_ENV) as (probe, _, _):
        big = probe.length.call_one(b"x" * (LIMIT + 100_000))
        behind = [probe.length.call_one(b"y" * i) for i in range(200)]
        with pytest.raises(Exception) as info:
            big.get(timeout=10)
        message = str(info.value)
        assert "rejecting oversize frame" in message and f"max={LIMIT}" in message, message
        assert "receiving side" in message and "MONARCH_MAX_FRAME_BYTES" in message and "HINT" in message
        assert [f.get(timeout=10) for f in behind] == list(range(200))


@pytest.mark.timeout(60)
def test_oversize_broadcast_is_a_supervision_event(monkeypatch):
    failures: list[object] = []
    reported = threading.Event()

    def hook(failure):
        failures.append(failure)
        reported.set()

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", hook)
    pm = this_host().spawn_procs(per_host={"gpus": 1}, env=SMALL_LIMIT_ENV)
    try:
        probe = pm.spawn("probe", Probe)
        assert probe.length.call_one(b"x").get(timeout=30) == 1
        probe.length.broadcast(b"x" * (LIMIT + 100_000))
        assert reported.wait(timeout=10), "no supervision event for the rejected broadcast"
        report = failures[0].report()
        assert "could not receive a message for its endpoint length()" in report, report
        assert "MONARCH_MAX_FRAME_BYTES" in report
    finally:
        pm.stop().get(timeout=10)
