"""A 1 GiB buffer moves whole, by a one-sided copy, and reports its speed."""

from __future__ import annotations

import os
import time

import pytest

from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer

GIB = 1 << 30
MIB = 1 << 20


class BigOwner(Actor):
    """1 GiB of distinct MiB: a random MiB repeated, each stamped with its index."""

    def __init__(self, pattern: bytes) -> None:
        self.data = bytearray(pattern) * (GIB // MIB)
        for i in range(GIB // MIB):
            self.data[i * MIB : i * MIB + 8] = i.to_bytes(8, "little")
        self.buffer = RDMABuffer(memoryview(self.data))

    @endpoint
    def get_buffer(self) -> RDMABuffer:
        return self.buffer


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_one_gib_is_read_whole() -> None:
    pattern = os.urandom(MIB)
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        buf = pm.spawn("big", BigOwner, pattern).get_buffer.call_one().get(timeout=60)
        dst = bytearray(GIB)
        view = memoryview(dst)
        start = time.monotonic()
        buf.read_into(view).get(timeout=60)
        elapsed = time.monotonic() - start
        print(f"1 GiB read in {elapsed:.2f} s ({GIB / elapsed / 1e9:.2f} GB/s)")
        tail = memoryview(pattern)[8:]
        bad = [
            i
            for i in range(GIB // MIB)
            if view[i * MIB : i * MIB + 8] != i.to_bytes(8, "little")
            or view[i * MIB + 8 : (i + 1) * MIB] != tail
        ]
        assert not bad, f"{len(bad)} MiB differ, first {bad[0]}"
    finally:
        pm.stop().get(timeout=30)
