"""Actors on CUDA: ``bootstrap`` sets a proc's environment before CUDA starts there, an
endpoint computes on the GPU, and CUDA tensors travel as arguments and results."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import requires_cuda

from monarch.actor import Actor, endpoint, this_host

pytestmark = [requires_cuda, pytest.mark.timeout(120)]


def pick_gpu() -> None:
    """Runs on each new proc before any actor: CUDA must not have started yet."""
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    os.environ["BOOTSTRAP_SAW_CUDA_STARTED"] = str(torch.cuda.is_initialized())


class GpuWorker(Actor):
    @endpoint
    def environment(self) -> tuple[str, str, int]:
        return (
            os.environ["CUDA_VISIBLE_DEVICES"],
            os.environ["BOOTSTRAP_SAW_CUDA_STARTED"],
            torch.cuda.device_count(),
        )

    @endpoint
    def square_sum(self, n: int) -> float:
        x = torch.arange(n, device="cuda", dtype=torch.float64)
        return float((x * x).sum().item())

    @endpoint
    def double(self, t: torch.Tensor) -> torch.Tensor:
        assert t.is_cuda
        return t * 2


def test_bootstrap_sets_the_environment_before_cuda_starts() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=pick_gpu)
    try:
        workers = procs.spawn("gpu", GpuWorker)
        seen = workers.environment.call().get(timeout=60)
        assert [v for _, v in seen.items()] == [("0", "False", 1)] * 2
        n = 1000
        expected = float(sum(i * i for i in range(n)))
        assert [v for _, v in workers.square_sum.call(n).get(timeout=60).items()] == [expected] * 2
    finally:
        procs.stop().get(timeout=30)


def test_cuda_tensors_travel_as_arguments_and_results() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        worker = procs.spawn("gpu", GpuWorker)
        t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)  # 4 MiB
        back = worker.double.call_one(t).get(timeout=60)
        assert back.is_cuda
        assert torch.equal(back, t * 2)
    finally:
        procs.stop().get(timeout=30)
