"""Distributed tensors on CUDA: factories with ``device="cuda"``, ``.cuda()``/``.to()``/``.cpu()``
moves, fetched shards that arrive in the client's CPU memory, and reductions among procs that
share one GPU (staged through gloo: NCCL refuses two ranks on one device)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from helpers import requires_cuda

import monarch
from monarch.actor import ProcMesh, this_host

pytestmark = [requires_cuda, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, preload=["torch"])
    yield pm
    pm.stop().get(timeout=30)


def on_cuda(t: torch.Tensor) -> torch.Tensor:
    """A remote function: 1 where the proc's shard lives on a CUDA device."""
    return torch.tensor(int(t.is_cuda))


def test_ops_run_on_each_procs_gpu_and_shards_come_back_to_the_cpu(procs: ProcMesh) -> None:
    where = monarch.remote(on_cuda, propagate=lambda t: torch.tensor(0))
    with procs.activate():
        r = procs.rank_tensor("gpus")
        x = torch.ones(4, device="cuda") * (r.cuda() + 1)
        y = torch.arange(4.0).cuda() + x  # made on the procs' CPUs, then moved
        z = y.to("cuda", torch.float64).cpu()
        flags = where(x)
    for g in (0, 1):
        shard = monarch.fetch_shard(y, gpus=g).get(timeout=60)
        assert shard.device.type == "cpu"
        assert shard.tolist() == [float(i + g + 1) for i in range(4)]
        assert monarch.inspect(flags, gpus=g).item() == 1
        assert monarch.inspect(z, gpus=g).dtype == torch.float64
    assert z.dtype == torch.float64 and y.shape == (4,)


def test_reductions_of_cuda_tensors_among_procs_sharing_one_gpu(procs: ProcMesh) -> None:
    with procs.activate():
        r = procs.rank_tensor("gpus")
        x = (r.cuda() + 1).to(torch.float32) * torch.ones(3, device="cuda")  # 1s and 2s
        total = x.reduce("gpus", "sum")
        high = x.reduce("gpus", "max")
        stacked = x.reduce("gpus", "stack")
        part = torch.ones(4, device="cuda").reduce("gpus", "sum", scatter=True)
    for g in (0, 1):
        assert monarch.inspect(total, gpus=g).tolist() == [3.0] * 3
        assert monarch.inspect(high, gpus=g).tolist() == [2.0] * 3
        assert monarch.inspect(stacked, gpus=g).tolist() == [[1.0] * 3, [2.0] * 3]
        assert monarch.inspect(part, gpus=g).tolist() == [2.0, 2.0]


def test_a_proc_with_a_gpu_of_its_own_reduces_over_nccl() -> None:
    """One proc, one GPU: the process group has NCCL for CUDA tensors."""

    def backend_of(t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        config = getattr(dist, "get_backend_config", dist.get_backend)()
        return torch.tensor(int("nccl" in str(config)))

    pm = this_host().spawn_procs(per_host={"gpus": 1}, preload=["torch"])
    try:
        check = monarch.remote(backend_of, propagate=lambda t: torch.tensor(0))
        with pm.activate():
            t = torch.full((2,), 5.0, device="cuda").reduce("gpus", "sum")
            nccl = check(t)
        assert monarch.inspect(t).tolist() == [5.0, 5.0]
        assert monarch.inspect(nccl).item() == 1
    finally:
        pm.stop().get(timeout=30)
