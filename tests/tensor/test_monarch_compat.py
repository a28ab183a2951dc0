"""Monarch's own tensor-engine tests (tests/test_tensor_engine.py of torchmonarch), on CPU procs:
tensors in spawn arguments, the order of calls with and without tensors, rref of a plain method
with ``as_endpoint``, ``propagate="inspect"``, ``slice_mesh(...).to_mesh(...)``, and the error type."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import monarch
from monarch.actor import Actor, ProcMesh, as_endpoint, endpoint, this_host
from monarch.mesh_controller import RemoteException

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def one() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm
    pm.stop().get(timeout=10)


class AddWithState(Actor):
    def __init__(self, state: torch.Tensor):
        self.state = state

    @endpoint
    def forward(self, x) -> torch.Tensor:
        return x + self.state


class Counter(Actor):
    def __init__(self):
        self.c = 0

    @endpoint
    def incr(self, x) -> int:
        self.c += 1
        return self.c - 1


class Linear(Actor):
    def __init__(self, n: int, m: int):
        self.weight = torch.zeros((n, m))

    def forward(self, x) -> torch.Tensor:
        return x @ self.weight

    @endpoint(propagate="inspect")
    def update(self, w: torch.Tensor) -> None:
        self.weight += w


def test_actor_with_tensors(one):
    with one.activate():
        x = one.spawn("adder", AddWithState, torch.ones(()))
        y = torch.ones(())
        assert x.forward.call(y).get(timeout=30).item(gpus=0).item() == 2


def test_actor_tensor_ordering(one):
    with one.activate():
        counter = one.spawn("a", Counter)
        results = []
        for _ in range(0, 10, 2):
            results.append(counter.incr.call(torch.ones(())))  # a tensor engine call
            results.append(counter.incr.call(1))  # a plain one
        assert list(range(10)) == [r.get(timeout=30).item(gpus=0) for r in results]


def test_rref_actor(one):
    with one.activate():
        x = one.spawn("linear", Linear, 3, 4)
        y = torch.ones((4, 3))
        t = as_endpoint(x.forward, propagate=lambda x: torch.rand(3, 4)).rref(y)
        assert monarch.inspect(t.sum()).item() == 0
        x.update.rref(torch.ones((3, 4)))
        t = as_endpoint(x.forward, propagate=lambda x: torch.rand(3, 4)).rref(y)
        assert monarch.inspect(t.sum()).item() == 3 * 4 * 4


def test_proc_mesh_tensor_engine(procs):
    with procs.activate():
        f = 10 * procs.rank_tensor("gpus")
        a = monarch.inspect(f, gpus=0)
        b = monarch.inspect(f, gpus=1)
    second = procs.slice(gpus=1)
    with second.activate():
        sliced_b = monarch.slice_mesh(f, gpus=1).to_mesh(second)
        c = monarch.inspect(sliced_b * 10)
    assert (a, b, c) == (0, 10, 100)


def test_remote_error_type(procs):
    @monarch.remote(propagate=lambda x: x)
    def nope(x):
        raise ValueError("nope")

    with pytest.raises(RemoteException, match="nope"), procs.activate():
        monarch.inspect(nope(torch.zeros(3, 4)))
