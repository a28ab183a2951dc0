"""Distributed tensors and actors: an endpoint gets its proc's shard, ``endpoint.rref`` makes a
distributed tensor of the endpoint's results, and both keep their place among the tensor ops."""

from __future__ import annotations

import pytest
import torch

import monarch
from monarch.actor import Actor, current_rank, endpoint, this_host

pytestmark = pytest.mark.timeout(90)


class Linear(Actor):
    def __init__(self) -> None:
        torch.manual_seed(1234 + current_rank()["gpus"])
        self.w = torch.rand(3, 3)

    @endpoint(propagate=lambda x: x)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w

    @endpoint
    def weights(self) -> torch.Tensor:
        return self.w

    @endpoint
    def describe(self, x: torch.Tensor) -> list:
        return [type(x).__name__, x.tolist()]

    @endpoint
    def forward_no_propagate(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.fixture(scope="module")
def setup():
    pm = this_host().spawn_procs(per_host={"gpus": 2}, preload=["torch"])  # one torch import for both
    linear = pm.spawn("linear", Linear)
    yield pm, linear
    pm.stop().get(timeout=10)


def test_an_endpoint_receives_its_procs_shard(setup):
    procs, linear = setup
    with procs.activate():
        r = procs.rank_tensor("gpus")
        t = torch.ones(2) * (r + 1)
        t.mul_(10)  # issued before the call: the actors see it
    got = linear.describe.call(t).get(timeout=30)
    assert got.item(gpus=0) == ["Tensor", [10.0, 10.0]]
    assert got.item(gpus=1) == ["Tensor", [20.0, 20.0]]


def test_rref_makes_a_distributed_tensor_of_the_results(setup):
    procs, linear = setup
    weights = linear.weights.call().get(timeout=30)
    with procs.activate():
        t = torch.rand(3, 3)
        o = torch.relu(linear.forward.rref(t))
        before = t.clone()
        t.add_(1)  # after the rref: forward saw t before this
    assert o.shape == (3, 3) and isinstance(o, monarch.Tensor)
    for g in (0, 1):
        x = monarch.inspect(before, gpus=g)
        assert torch.allclose(monarch.inspect(o, gpus=g), torch.relu(x @ weights.item(gpus=g)))


def test_rref_outside_activate_takes_the_mesh_of_its_tensor_argument(setup):
    procs, linear = setup
    with procs.activate():
        t = torch.eye(3)
    o = linear.forward.rref(t)  # the guide's own usage, after the block
    w1 = linear.weights.call().get(timeout=30).item(gpus=1)
    assert torch.allclose(monarch.inspect(o, gpus=1), w1)


def test_rref_needs_propagate(setup):
    procs, linear = setup
    with procs.activate():
        t = torch.ones(3)
        with pytest.raises(ValueError, match="HINT: declare it with @endpoint\\(propagate="):
            linear.forward_no_propagate.rref(t)
