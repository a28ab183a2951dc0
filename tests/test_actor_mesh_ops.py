"""Shape operations on a spawned ActorMesh: the derived meshes address the right actors."""

from __future__ import annotations

import pytest

from monarch.actor import Actor, Extent, context, current_rank, endpoint, this_host


class Where(Actor):
    @endpoint
    def base(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    def message_point(self) -> dict:
        return dict(current_rank())


@pytest.fixture(scope="module")
def mesh():
    procs = this_host().spawn_procs(per_host={"x": 2, "y": 2})
    try:
        m = procs.spawn("where", Where)
        assert m.base.call().get(timeout=20).values() == [0, 1, 2, 3]
        yield m
    finally:
        procs.stop().get(timeout=10)


def test_size_sizes_extent_len(mesh):
    assert len(mesh) == 4
    assert mesh.size() == 4
    assert mesh.size("x") == 2
    assert mesh.size(["x", "y"]) == 4
    assert mesh.sizes == {"x": 2, "y": 2}
    assert mesh.extent == Extent(["x", "y"], [2, 2])
    with pytest.raises(KeyError):
        mesh.size("z")


def test_slice_with_int_drops_dimension(mesh):
    row = mesh.slice(x=1)
    assert row.sizes == {"y": 2}
    vm = row.base.call().get(timeout=10)
    assert vm.values() == [2, 3]
    assert vm.extent.labels == ["y"]
    assert mesh.slice(x=1, y=0).base.call_one().get(timeout=10) == 2


def test_slice_with_range_keeps_dimension(mesh):
    col = mesh.slice(y=slice(1, 2))
    assert col.sizes == {"x": 2, "y": 1}
    assert col.base.call().get(timeout=10).values() == [1, 3]
    points = col.message_point.call().get(timeout=10).values()
    assert points == [{"x": 0, "y": 0}, {"x": 1, "y": 0}]


def test_slice_of_slice(mesh):
    assert mesh.slice(x=slice(0, 2)).slice(y=1).slice(x=1).base.call_one().get(timeout=10) == 3


def test_flatten(mesh):
    flat = mesh.flatten("r")
    assert flat.sizes == {"r": 4}
    assert flat.base.call().get(timeout=10).values() == [0, 1, 2, 3]
    assert flat.slice(r=2).base.call_one().get(timeout=10) == 2


def test_rename(mesh):
    renamed = mesh.rename(x="hosts", y="gpus")
    assert renamed.extent.labels == ["hosts", "gpus"]
    vm = renamed.base.call().get(timeout=10)
    assert vm.item(hosts=1, gpus=0) == 2
    assert renamed.slice(gpus=1).base.call().get(timeout=10).values() == [1, 3]


def test_split(mesh):
    split = mesh.flatten("r").split(r=("a", "b"), b=4)
    assert split.sizes == {"a": 1, "b": 4}
    assert split.base.call().get(timeout=10).values() == [0, 1, 2, 3]
    split2 = mesh.flatten("r").split(r=("dp", "tp"), tp=2)
    assert split2.sizes == {"dp": 2, "tp": 2}
    assert split2.slice(tp=1).base.call().get(timeout=10).values() == [1, 3]
    with pytest.raises(ValueError):
        mesh.flatten("r").split(r=("a", "b"), b=3)


def test_unknown_dimension(mesh):
    with pytest.raises(TypeError, match="Shape does not have dimension labeled"):
        mesh.slice(gpus=0)
    with pytest.raises(IndexError):
        mesh.slice(x=2)
