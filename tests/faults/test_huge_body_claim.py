"""A frame that claims a huge body does not make the receiver allocate it ahead of its bytes.

An authenticated peer sends a header announcing a 9 GiB body (under the default 10 GiB limit)
and then only 1 MiB of it: the worker's memory grows with what arrived, not with the claim.
"""

from __future__ import annotations

import pytest
from fault_helpers import authenticated_connection, frame_head, probe_worker, rss, unsent_bytes
from helpers import wait_until

CLAIM = 9 << 30
SENT = 1 << 20
RSS_GROWTH_BOUND = 256 << 20


@pytest.mark.timeout(60)
def test_claimed_body_is_not_allocated_ahead():
    with probe_worker() as (probe, pid, address):
        before = rss(pid)
        with authenticated_connection(address) as s:
            header = {
                "k": 1,
                "d": "no-such-actor",
                "e": "ping",
                "p": None,
                "r": 0,
                "x": [[], []],
                "b": [CLAIM],
            }
            s.sendall(frame_head(header) + b"z" * SENT)
            wait_until(lambda: unsent_bytes(s) == 0, 20, "the worker to read what was sent")
            growth = rss(pid) - before
            assert growth < RSS_GROWTH_BOUND, (
                f"worker grew by {growth >> 20} MiB for a {SENT >> 20} MiB start"
            )
        assert probe.ping.call_one("still serving").get(timeout=10) == "still serving"
