"""A connection keeps the frames it wrote only until its peer acknowledges them
(``transport.read_count``): after a long burst, what it keeps is at most one acknowledgement's
interval, not the burst (it would keep up to ``resend_keep_messages`` without them)."""

from __future__ import annotations

import pytest
from helpers import wait_until

from monarch._src.actor.process_state import runtime
from monarch._src.runtime.config import configured
from monarch._src.transport.outgoing import UNKEPT_RUNS
from monarch._src.transport.read_count import ACK_BYTES, ACK_FRAMES
from monarch.actor import Actor, endpoint, this_host

PAD = b"x" * 1024
BURST = 6 * ACK_FRAMES


class Counter(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def add(self, pad: bytes) -> None:
        self.n += 1

    @endpoint
    def count(self) -> tuple[int, str]:
        return self.n, runtime().address


@pytest.mark.timeout(60)
def test_a_connection_keeps_only_what_its_peer_has_not_acknowledged() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        counter = pm.spawn("counter", Counter)
        _, address = counter.count.call_one().get(timeout=30)
        conn = runtime()._conns[address]
        sent_before = conn.frames_sent
        for _ in range(BURST):
            counter.add.broadcast(PAD)
        assert counter.count.call_one().get(timeout=30)[0] == BURST
        assert conn.frames_sent - sent_before >= BURST + 1
        wait_until(lambda: len(conn._retained) <= ACK_FRAMES, 10, "the acknowledgements to come")
        assert conn._retained_bytes <= ACK_BYTES + ACK_FRAMES * len(PAD)
        assert conn._retained_from >= BURST - ACK_FRAMES
    finally:
        pm.stop().get(timeout=10)


@pytest.mark.timeout(60)
def test_frames_forgotten_before_they_were_acknowledged_leave_no_record_once_read() -> None:
    """Beyond a small bound (``resend_keep_messages``), the connection forgets written frames
    before the peer acknowledged them, and records where they were going, in case they were
    never read (``OutgoingConnection.lost``); the record is bounded, and holds only what the
    peer has not acknowledged yet: at most one acknowledgement's interval."""
    with configured(resend_keep_messages=16):
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            counter = pm.spawn("counter", Counter)
            _, address = counter.count.call_one().get(timeout=30)
            conn = runtime()._conns[address]
            for _ in range(BURST):
                counter.add.broadcast(PAD)
            assert counter.count.call_one().get(timeout=30)[0] == BURST
            assert len(conn._unkept) <= UNKEPT_RUNS

            def recorded() -> int:
                with conn._lock:
                    return sum(count for _, count, _ in conn._unkept)

            wait_until(lambda: recorded() <= ACK_FRAMES, 10, "the acknowledgements to come")
            assert all(first >= conn.first_index + BURST - ACK_FRAMES for first, _, _ in conn._unkept)
        finally:
            pm.stop().get(timeout=10)
