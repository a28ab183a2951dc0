"""Reductions across mesh dimensions on torch.distributed (gloo), rank_tensor, slice_mesh, to_mesh."""

from __future__ import annotations

import pytest
import torch

import monarch
from monarch.actor import this_host

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    yield pm
    pm.stop().get(timeout=10)


def everywhere(t) -> dict[tuple[int, int], list]:
    return {(h, g): monarch.inspect(t, hosts=h, gpus=g).tolist() for h in (0, 1) for g in (0, 1)}


def test_rank_tensor_gives_each_proc_its_index(procs):
    with procs.activate():
        g = procs.rank_tensor("gpus")
        both = procs.rank_tensor(["hosts", "gpus"])
    assert g.shape == () and g.dtype == torch.int64
    assert {k: v for k, v in everywhere(g).items()} == {(0, 0): 0, (0, 1): 1, (1, 0): 0, (1, 1): 1}
    assert everywhere(both) == {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}


def test_every_reduction_over_one_and_two_dimensions(procs):
    with procs.activate():
        r = procs.rank_tensor(["hosts", "gpus"])  # 0..3, row-major
        x = (r + 1).to(torch.float32) * torch.ones(2)  # 1..4
        bits = torch.ones(2, dtype=torch.int64) << r  # 1, 2, 4, 8
        total = x.reduce(["hosts", "gpus"], "sum")
        per_host = x.reduce("gpus", "sum")
        avg = x.reduce("hosts", "avg")
        prod = x.reduce("gpus", "product")
        low = x.reduce("gpus", "min")
        high = x.reduce(["hosts", "gpus"], "max")
        bor = bits.reduce(["hosts", "gpus"], "bor")
        band = bits.reduce("gpus", "band")
        bxor = (bits | 1).reduce("gpus", "bxor")
        stacked = x.reduce("gpus", "stack")
    assert stacked.shape == (2, 2) and total.shape == (2,)
    assert everywhere(total) == {k: [10.0, 10.0] for k in everywhere(total)}
    assert everywhere(per_host) == {
        (0, 0): [3.0] * 2,
        (0, 1): [3.0] * 2,
        (1, 0): [7.0] * 2,
        (1, 1): [7.0] * 2,
    }
    assert everywhere(avg) == {(0, 0): [2.0] * 2, (0, 1): [3.0] * 2, (1, 0): [2.0] * 2, (1, 1): [3.0] * 2}
    assert monarch.inspect(prod, hosts=1).tolist() == [12.0, 12.0]
    assert monarch.inspect(low, hosts=1, gpus=1).tolist() == [3.0, 3.0]
    assert monarch.inspect(high).tolist() == [4.0, 4.0]
    assert monarch.inspect(bor, hosts=1).tolist() == [15, 15]
    assert monarch.inspect(band).tolist() == [0, 0]
    assert monarch.inspect(bxor, hosts=1).tolist() == [(5 ^ 9)] * 2
    assert monarch.inspect(stacked, hosts=1, gpus=0).tolist() == [[3.0, 3.0], [4.0, 4.0]]


def test_scatter_keeps_each_procs_slice_of_the_result(procs):
    with procs.activate():
        r = procs.rank_tensor("gpus")
        x = torch.arange(4, dtype=torch.float32) + r  # gpus 0: 0 1 2 3, gpus 1: 1 2 3 4
        part = x.reduce("gpus", "sum", scatter=True)
    assert part.shape == (2,)
    assert monarch.inspect(part, gpus=0).tolist() == [1.0, 3.0]
    assert monarch.inspect(part, hosts=1, gpus=1).tolist() == [5.0, 7.0]


def test_in_place_reduction_and_bad_arguments(procs):
    with procs.activate():
        x = torch.ones(3)
        same = x.reduce("gpus", "sum", _inplace=True)
        assert same is x
        with pytest.raises(ValueError, match="Monarch's reductions are stack, sum"):
            x.reduce("gpus", "mean")
        with pytest.raises(ValueError, match="dimensions"):
            x.reduce("nodes", "sum")
        with pytest.raises(ValueError, match="does not divide"):
            x.reduce("gpus", "sum", scatter=True)
    assert monarch.inspect(x, hosts=1).tolist() == [2.0, 2.0, 2.0]


def test_slice_mesh_and_to_mesh_keep_the_local_values(procs):
    with procs.activate():
        r = procs.rank_tensor(["hosts", "gpus"]) * 1
    on_host1 = monarch.slice_mesh(r, hosts=1)
    assert monarch.get_active_mesh() is None
    assert on_host1.mesh.extent == procs.slice(hosts=1).extent
    assert monarch.inspect(on_host1, gpus=1).item() == 3
    with procs.slice(hosts=1).activate():
        doubled = on_host1 * 2
        summed = doubled.reduce("gpus", "sum")  # a process group of the slice only
        with pytest.raises(ValueError, match="HINT: move it first"):
            r + 1
    assert monarch.inspect(summed).item() == 10
    moved = monarch.to_mesh(r, procs.slice(hosts=0))
    assert monarch.inspect(moved, gpus=1).item() == 1
