"""Strangers cannot exhaust a worker: 5,000 idle unauthenticated connections keep it small.

Until a peer authenticates, its connection holds a few bytes of buffer, and at most
``MAX_PENDING_HANDSHAKES`` such connections are kept (the oldest is dropped), so the flood
costs neither memory nor descriptors, and a real peer still gets in.
"""

from __future__ import annotations

import socket
import time

import pytest
from fault_helpers import authenticated_connection, probe_worker, rss, socket_path

FLOOD = 5000
RSS_GROWTH_BOUND = 64 << 20


def open_idle(path: str, n: int, timeout: float = 30.0) -> list[socket.socket]:
    socks: list[socket.socket] = []
    deadline = time.monotonic() + timeout
    while len(socks) < n:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:  # the backlog is full for now: the worker is accepting
            s.close()
            if time.monotonic() > deadline:
                pytest.fail(f"only {len(socks)} of {n} connections got through")
            continue
        socks.append(s)
    return socks


@pytest.mark.timeout(90)
def test_idle_strangers_keep_the_worker_small():
    with probe_worker() as (probe, pid, address):
        before = rss(pid)
        socks = open_idle(socket_path(address), FLOOD)
        try:
            # Accepted in order: once this one is through the handshake, so is the flood.
            authenticated_connection(address).close()
            growth = rss(pid) - before
            assert growth < RSS_GROWTH_BOUND, f"worker grew by {growth >> 20} MiB for {FLOOD} idle strangers"
            assert probe.ping.call_one("still serving").get(timeout=10) == "still serving"
        finally:
            for s in socks:
                s.close()
