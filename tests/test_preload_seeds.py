"""Workers forked from a template that preloaded torch draw their own random numbers, as workers
that import torch themselves do (torch seeds its CPU generator at import, once per process)."""

from __future__ import annotations

import pytest

from monarch.actor import Actor, endpoint, this_host

torch = pytest.importorskip("torch")


class Draw(Actor):
    @endpoint
    def draw(self) -> tuple[int, list[float]]:
        return torch.initial_seed(), torch.rand(4).tolist()


@pytest.mark.timeout(60)
def test_preloaded_torch_gives_each_worker_its_own_seed() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2}, preload=["torch"])
    try:
        (seed0, draw0), (seed1, draw1) = procs.spawn("draw", Draw).draw.call().get(timeout=30).values()
    finally:
        procs.stop().get(timeout=20)
    assert seed0 != seed1 and draw0 != draw1
