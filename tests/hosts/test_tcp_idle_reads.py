"""A TCP connection reset from outside (``ss -K``) while a sync actor's thread reads it itself
(``runtime/idle_reads``): the thread reads the reset, the loop settles it as for any drop, and
every call runs once, in order, over the connection that replaces it."""

from __future__ import annotations

import pytest
from tcp_helpers import tcp_procs
from test_idle_reads import Log
from test_tcp_peer_loss import kill_connections_to


@pytest.mark.timeout(120)
def test_a_reset_read_by_the_actors_thread_loses_nothing_and_runs_nothing_twice() -> None:
    with tcp_procs() as pm:
        log = pm.spawn("log", Log)
        address = log.address.call_one().get(timeout=30)
        assert address.startswith("tcp:")
        assert log.reads_when_idle.call_one().get(timeout=30) >= 1, "its thread reads the client's connection"
        n = 2000
        sent = 0
        futures = []
        for _ in range(2):
            # Idle (its thread holds the connection), then in the middle of a burst.
            kill_connections_to(address)
            futures += [log.append.call_one(i) for i in range(sent, sent + n // 2)]
            sent += n // 2
            futures[sent - n // 4].get(timeout=30)
            kill_connections_to(address)
            futures += [log.append.call_one(i) for i in range(sent, sent + n // 2)]
            sent += n // 2
            assert [f.get(timeout=60) for f in futures] == list(range(1, sent + 1))
        assert log.get.call_one().get(timeout=30) == list(range(sent))
