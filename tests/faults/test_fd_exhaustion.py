"""A worker out of file descriptors is not dead: its peers wait, and it logs the cause once.

Worker A's descriptor limit is lowered (prlimit, from outside) and the test floods A's socket
with idle connections: A runs out of descriptors and its listen backlog fills, so worker B's
first connection to A is refused for now. B keeps retrying within MONARCH_PEER_UNREACHABLE_S
instead of declaring A dead; once the flood goes away, B's call to A completes. A's log has one
line about it, not a traceback per failed accept.
"""

from __future__ import annotations

import socket

import psutil
import pytest
from fault_helpers import Probe, Relay, socket_path, worker_log
from helpers import wait_until

from monarch.actor import this_host

FLOOD = 5000


def flood(path: str) -> list[socket.socket]:
    """Idle connections to ``path`` until its backlog is full (a connect would block)."""
    socks = []
    for _ in range(FLOOD):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            return socks
        socks.append(s)
    pytest.fail(f"{FLOOD} connections did not fill the backlog of {path}")


@pytest.mark.timeout(60)
def test_descriptor_exhaustion_is_not_death():
    pa = this_host().spawn_procs(per_host={"gpus": 1})
    pb = this_host().spawn_procs(per_host={"gpus": 1})
    socks: list[socket.socket] = []
    try:
        a = pa.spawn("a", Probe)
        b = pb.spawn("b", Relay)
        a_pid, a_address = a.where.call_one().get(timeout=30)
        b_pid, _ = b.where.call_one().get(timeout=30)
        a.note.call_one("log file open before descriptors run out").get(timeout=10)
        worker = psutil.Process(a_pid)
        limits = worker.rlimit(psutil.RLIMIT_NOFILE)
        worker.rlimit(psutil.RLIMIT_NOFILE, (worker.num_fds() + 8, limits[1]))
        socks = flood(socket_path(a_address))
        wait_until(
            lambda: "cannot accept connections" in worker_log(a_pid), 20, "A to run out of descriptors"
        )

        reply = b.forward.call_one(a, "through")
        wait_until(lambda: f"cannot reach {a_address} yet" in worker_log(b_pid), 20, "B to be refused")
        for s in socks:
            s.close()
        socks = []
        assert reply.get(timeout=30) == "through"
        worker.rlimit(psutil.RLIMIT_NOFILE, limits)

        log = worker_log(a_pid)
        assert log.count("cannot accept connections") == 1, log[-3000:]
        assert "Too many open files" in log and "Traceback" not in log, log[-3000:]
        assert b.forward.call_one(a, "again").get(timeout=30) == "again"
    finally:
        for s in socks:
            s.close()
        pa.stop().get(timeout=10)
        pb.stop().get(timeout=10)
