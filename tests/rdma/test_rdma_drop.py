"""A registration keeps its memory alive, however the owner lets go of it, until ``drop()``;
then the memory goes back."""

from __future__ import annotations

import gc

import psutil
import pytest

from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20


class Registrar(Actor):
    @endpoint
    def register_temporary(self, size: int) -> RDMABuffer:
        data = bytearray(size)
        data[::4096] = b"\x01" * len(data[::4096])  # touch every page
        return RDMABuffer(memoryview(data))  # only the registration holds `data` from here

    @endpoint
    def rss_mib(self) -> int:
        gc.collect()
        return psutil.Process().memory_info().rss // MIB


def test_the_registration_holds_the_memory_until_drop() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        registrar = pm.spawn("registrar", Registrar)
        before = registrar.rss_mib.call_one().get()
        buf = registrar.register_temporary.call_one(128 * MIB).get()
        held = registrar.rss_mib.call_one().get()
        assert held >= before + 120
        out = bytearray(buf.size())
        buf.read_into(memoryview(out)).get(timeout=30)  # still readable: nothing was freed
        assert out[::4096] == b"\x01" * len(out[::4096])
        buf.drop().get(timeout=10)
        assert registrar.rss_mib.call_one().get() <= before + 8
    finally:
        pm.stop().get(timeout=10)
