"""RDMABuffer over CUDA memory (Monarch 0.7 takes CPU or CUDA tensors): read into and written
from CPU and CUDA memory, from another process of the host and from the owner's own process.
Device memory is staged through host memory in chunks (see ``rdma/memory.py``)."""

from __future__ import annotations

import pytest
import torch
from helpers import requires_cuda

from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer

pytestmark = [requires_cuda, pytest.mark.timeout(120)]

SIZE = (8 << 20) + 123  # several chunks, and a partial one


class GpuOwner(Actor):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.data = torch.randint(0, 256, (SIZE,), dtype=torch.uint8, generator=g).cuda()
        self.buffer = RDMABuffer(self.data)

    @endpoint
    def get_buffer(self) -> RDMABuffer:
        return self.buffer

    @endpoint
    def checksum(self) -> int:
        return int(self.data.to(torch.int64).sum().item())


class GpuReader(Actor):
    @endpoint
    def read_both_ways(self, buffer: RDMABuffer) -> tuple[int, int]:
        host = torch.zeros(SIZE, dtype=torch.uint8)
        device = torch.zeros(SIZE, dtype=torch.uint8, device="cuda")
        buffer.read_into(host).get(timeout=60)
        buffer.read_into(device).get(timeout=60)
        return int(host.to(torch.int64).sum()), int(device.to(torch.int64).sum().item())

    @endpoint
    def write_ones(self, buffer: RDMABuffer) -> None:
        buffer.write_from(torch.ones(SIZE, dtype=torch.uint8, device="cuda")).get(timeout=60)


def test_cuda_buffers_are_read_and_written_from_another_process() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        owner = procs.slice(gpus=0).spawn("owner", GpuOwner)
        reader = procs.slice(gpus=1).spawn("reader", GpuReader)
        buffer = owner.get_buffer.call_one().get(timeout=60)
        assert buffer.size() == SIZE
        expected = owner.checksum.call_one().get(timeout=60)
        assert reader.read_both_ways.call_one(buffer).get(timeout=60) == (expected, expected)
        reader.write_ones.call_one(buffer).get(timeout=60)
        assert owner.checksum.call_one().get(timeout=60) == SIZE
    finally:
        procs.stop().get(timeout=30)


def test_cuda_buffer_in_the_owners_own_process() -> None:
    data = torch.arange(SIZE, dtype=torch.int64).remainder(251).to(torch.uint8).cuda()
    buffer = RDMABuffer(data)
    host = torch.zeros(SIZE, dtype=torch.uint8)
    device = torch.zeros(SIZE, dtype=torch.uint8, device="cuda")
    buffer.read_into(host).get(timeout=60)
    buffer.read_into(device).get(timeout=60)
    assert torch.equal(host, data.cpu()) and torch.equal(device, data)
    buffer.write_from(torch.full((16,), 9, dtype=torch.uint8)).get(timeout=60)
    assert data[:16].tolist() == [9] * 16 and data[16].item() == 16 % 251
    buffer.drop().get(timeout=30)
