"""What ``monarch.rdma`` accepts and refuses, with Monarch's messages, and what a handle is:
a small picklable reference, usable without torch."""

from __future__ import annotations

import pickle

import pytest
from helpers import run_python

from monarch._src.runtime.config import CONFIG
from monarch.actor import context
from monarch.rdma import (
    RDMAAction,
    RDMABuffer,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)

pytestmark = pytest.mark.timeout(60)


def test_size_zero_and_unsupported_memory_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^Cannot create RDMABuffer with size 0\.$"):
        RDMABuffer(memoryview(bytearray()))
    with pytest.raises(
        ValueError, match="only supports 1d contiguous torch.Tensor or 1d c-contiguous memoryview"
    ):
        RDMABuffer(memoryview(bytearray(16)).cast("B", (4, 4)))
    with pytest.raises(ValueError, match="Got: bytearray"):
        RDMABuffer(bytearray(16))  # type: ignore[arg-type]
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="1d contiguous"):
        RDMABuffer(torch.zeros(8, dtype=torch.uint8)[::2])


def test_sizes_are_checked_when_an_operation_is_queued() -> None:
    buf = RDMABuffer(memoryview(bytearray(100)))
    try:
        with pytest.raises(
            ValueError, match=r"destination local memory size \(99\) must be >= remote buffer size \(100\)"
        ):
            buf.read_into(memoryview(bytearray(99)))
        with pytest.raises(
            ValueError, match=r"source local memory size \(101\) must be <= remote buffer size \(100\)"
        ):
            buf.write_from(memoryview(bytearray(101)))
        with pytest.raises(ValueError, match="read-only"):
            buf.read_into(memoryview(bytes(100)))
        with pytest.raises(ValueError, match="invalid RDMA timeout"):
            buf.read_into(memoryview(bytearray(100)), timeout=-1)
        with pytest.raises(NotImplementedError):
            RDMAAction().fetch_add(buf, memoryview(bytearray(8)), 1)
    finally:
        buf.drop().get(timeout=10)


def test_a_buffer_over_read_only_memory_can_be_read_not_written() -> None:
    data = bytes(range(256))
    buf = RDMABuffer(memoryview(data))
    try:
        out = bytearray(256)
        buf.read_into(memoryview(out)).get(timeout=10)
        assert bytes(out) == data
        with pytest.raises(ValueError, match="read-only memory: it can be read, not written"):
            buf.write_from(memoryview(bytearray(1)))
    finally:
        buf.drop().get(timeout=10)


def test_the_handle_pickles_small_and_names_its_owner() -> None:
    data = bytearray(64 << 20)
    buf = RDMABuffer(memoryview(data))
    try:
        wire = pickle.dumps(buf)
        assert len(wire) < 1024
        copy = pickle.loads(wire)
        assert copy.size() == buf.size() == 64 << 20 and copy.owner == buf.owner
        assert buf.owner == str(context().actor_instance.actor_id)  # the client's root made it
        assert buf.backend == get_rdma_backend() == "tcp"
    finally:
        buf.drop().get(timeout=10)


def test_backends_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_ibverbs_available() is False  # no RDMA device on this machine
    with pytest.warns(DeprecationWarning):
        assert is_rdma_available() is False
    monkeypatch.setattr(CONFIG, "rdma_allow_tcp_fallback", False)
    assert get_rdma_backend() == "none"
    with pytest.raises(RuntimeError, match="Tried to create an RDMABuffer, but RDMA is not available"):
        RDMABuffer(memoryview(bytearray(8)))
    monkeypatch.setattr(CONFIG, "rdma_allow_tcp_fallback", True)
    monkeypatch.setattr(CONFIG, "rdma_backend", "ibverbs")
    with pytest.raises(ValueError, match="no ibverbs backend yet"):
        get_rdma_backend()
    monkeypatch.setattr(CONFIG, "rdma_backend", "none")
    assert get_rdma_backend() == "none"


def test_memoryviews_need_no_torch_and_the_fallback_is_noticed_once() -> None:
    code = """
import sys, warnings
from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning

class Owner(Actor):
    def __init__(self):
        self.data = bytearray(b"x" * 4096)
        self.buf = RDMABuffer(memoryview(self.data))
    @endpoint
    def get(self):
        return self.buf, "torch" in sys.modules

pm = this_host().spawn_procs(per_host={"gpus": 1})
buf, owner_has_torch = pm.spawn("o", Owner).get.call_one().get(timeout=30)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always", RDMATcpFallbackWarning)
    for _ in range(3):
        out = bytearray(4096)
        buf.read_into(memoryview(out)).get(timeout=30)
notices = [w for w in seen if issubclass(w.category, RDMATcpFallbackWarning)]
print("RESULT", bytes(out) == b"x" * 4096, owner_has_torch, "torch" in sys.modules, len(notices))
pm.stop().get(timeout=10)
"""
    done = run_python(code, timeout=50, MONARCH_RDMA_BACKEND="tcp", PYTHONPATH="")
    assert done.returncode == 0, done.stderr
    assert "RESULT True False False 1" in done.stdout, done.stdout + done.stderr
