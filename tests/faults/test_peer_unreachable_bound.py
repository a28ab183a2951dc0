"""A live peer that stays unreachable is declared dead after MONARCH_PEER_UNREACHABLE_S.

Worker A is frozen (SIGSTOP) before worker B first connects to it: B's connection sits in A's
backlog and the handshake never comes. B waits out the bound (2 s here), then declares A dead:
its call to A fails with an error naming the setting, instead of hanging.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from fault_helpers import Probe, Relay
from helpers import freeze

from monarch.actor import this_host

BOUND_S = 2


@pytest.mark.timeout(60)
def test_unreachable_peer_is_dead_after_the_bound():
    env = {"MONARCH_PEER_UNREACHABLE_S": str(BOUND_S)}
    pa = this_host().spawn_procs(per_host={"gpus": 1}, env=env)
    pb = this_host().spawn_procs(per_host={"gpus": 1}, env=env)
    try:
        a = pa.spawn("a", Probe)
        b = pb.spawn("b", Relay)
        a_pid, _ = a.where.call_one().get(timeout=30)
        b.where.call_one().get(timeout=30)
        freeze(a_pid)
        try:
            start = time.monotonic()
            with pytest.raises(Exception) as info:
                b.forward.call_one(a, "frozen").get(timeout=30)
            took = time.monotonic() - start
        finally:
            os.kill(a_pid, signal.SIGCONT)
        message = str(info.value)
        assert f"could not be reached within {float(BOUND_S)}s" in message, message
        assert "MONARCH_PEER_UNREACHABLE_S" in message
        assert BOUND_S <= took < BOUND_S + 5, took
        assert a.ping.call_one("thawed").get(timeout=10) == "thawed"  # the client's view is its own
    finally:
        pa.stop().get(timeout=10)
        pb.stop().get(timeout=10)
