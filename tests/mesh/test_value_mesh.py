"""ValueMesh: construction, access by rank and coordinates, MeshTrait ops, repr, pickling."""

import pickle

import pytest

from monarch._src.mesh.extent import Extent
from monarch._src.mesh.ndslice import Slice
from monarch._src.mesh.point import Point
from monarch._src.mesh.shape import Shape
from monarch._src.mesh.value_mesh import ValueMesh


def shape(**sizes: int) -> Shape:
    return Shape(list(sizes), Slice.new_row_major(list(sizes.values())))


def hg() -> ValueMesh[int]:
    return ValueMesh(shape(hosts=2, gpus=4), [10 * i for i in range(8)])


def test_generic_alias_is_class() -> None:
    assert ValueMesh[int] is ValueMesh


def test_construction_and_access() -> None:
    vm = hg()
    assert len(vm) == 8
    assert vm.values() == [0, 10, 20, 30, 40, 50, 60, 70]
    assert vm.get(3) == 30
    with pytest.raises(ValueError, match="out of range"):
        vm.get(8)
    with pytest.raises(ValueError, match="out of range"):
        vm.get(-1)
    with pytest.raises(ValueError):
        ValueMesh(shape(gpus=2), [1, 2, 3])


def test_values_returns_copy() -> None:
    vm = hg()
    vm.values().append(99)
    assert len(vm.values()) == 8


def test_from_indexed() -> None:
    s = shape(gpus=3)
    vm = ValueMesh.from_indexed(s, [(2, "c"), (0, "x"), (1, "b"), (0, "a")])
    assert vm.values() == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"expected 3 .* contains 2"):
        ValueMesh.from_indexed(s, [(0, "a"), (2, "c"), (0, "z")])


def test_items_and_iter() -> None:
    vm = ValueMesh(shape(hosts=1, gpus=2), ["a", "b"])
    extent = Extent(["hosts", "gpus"], [1, 2])
    items = list(vm.items())
    assert items == [(Point(0, extent), "a"), (Point(1, extent), "b")]
    assert list(vm) == items
    assert [v for _, v in vm] == ["a", "b"]
    assert [p["gpus"] for p, _ in vm] == [0, 1]


def test_item() -> None:
    vm = hg()
    assert vm.item(hosts=1, gpus=2) == 60
    assert vm.item(gpus=3, hosts=0) == 30
    with pytest.raises(KeyError):
        vm.item(hosts=1)
    with pytest.raises(KeyError) as info:
        vm.item(hosts=1, gpus=2, zz=0)
    assert info.value.args[0] == "item has extra dimensions: ['zz']"
    with pytest.raises(ValueError):
        vm.item(hosts=2, gpus=0)


def test_item_zero_dim() -> None:
    vm = ValueMesh(Shape.unity(), ["only"])
    assert vm.item() == "only"
    assert hg().slice(hosts=1, gpus=2).item() == 60


def test_value_mesh_addressing_spec_example() -> None:
    # {hosts:1, gpus:2} where only gpus=1 was incremented.
    vm = ValueMesh(shape(hosts=1, gpus=2), [0, 1])
    assert vm.item(hosts=0, gpus=0) == 0
    assert vm.item(hosts=0, gpus=1) == 1
    assert vm.slice(hosts=0, gpus=1).item() == 1
    assert list(pickle.loads(pickle.dumps(list(vm)))) == list(vm)


def test_slice_maps_values_by_position() -> None:
    vm = hg()
    s = vm.slice(gpus=slice(1, 3))
    assert s.values() == [10, 20, 50, 60]
    assert s.extent == Extent(["hosts", "gpus"], [2, 2])
    assert s.item(hosts=1, gpus=0) == 50
    # Slice of a (non-contiguous) slice still finds the right values.
    assert s.slice(hosts=1).values() == [50, 60]
    assert s.slice(gpus=1).values() == [20, 60]
    assert s.slice(hosts=1, gpus=1).item() == 60


def test_flatten_split_rename() -> None:
    vm = hg()
    assert vm.flatten("r").slice(r=5).item() == 50
    assert vm.flatten("r").sizes == {"r": 8}
    sp = vm.split(gpus=("tp", "cp"), cp=2)
    assert sp.sizes == {"hosts": 2, "tp": 2, "cp": 2}
    assert sp.item(hosts=1, tp=1, cp=0) == 60
    assert sp.slice(cp=1).values() == [10, 30, 50, 70]
    r = vm.rename(gpus="g")
    assert r.extent.labels == ["hosts", "g"]
    assert r.item(hosts=0, g=2) == 20
    assert vm.size("gpus") == 4
    with pytest.raises(ValueError, match="cannot flatten sparse mesh"):
        vm.slice(gpus=slice(1, 3)).flatten("r")


def test_ops_on_sliced_value_mesh_with_offset() -> None:
    # A ValueMesh whose shape does not start at base rank 0 (e.g. a reply from a sliced mesh).
    s = Shape(["gpus"], Slice(offset=4, sizes=[4], strides=[1]))
    vm = ValueMesh(s, ["a", "b", "c", "d"])
    assert vm.slice(gpus=slice(1, None, 2)).values() == ["b", "d"]
    assert vm.split(gpus=("x", "y"), y=2).slice(y=0).values() == ["a", "c"]


def test_repr() -> None:
    vm = ValueMesh(shape(gpus=2), ["v0", "v1"])
    assert repr(vm) == "ValueMesh({gpus: 2}):\n  (({'gpus': 0/2}, 'v0'), ({'gpus': 1/2}, 'v1'))"
    z = ValueMesh(Shape.unity(), [3])
    assert repr(z) == "ValueMesh({}):\n  (({}, 3),)"


def test_pickle() -> None:
    vm = hg().slice(gpus=slice(1, 3))
    fn, args = vm.__reduce__()
    assert fn is ValueMesh
    assert args[0] == vm._shape and args[1] == vm.values()
    vm2 = pickle.loads(pickle.dumps(vm))
    assert vm2.values() == vm.values()
    assert vm2.extent == vm.extent
    assert list(vm2) == list(vm)
    assert vm2.slice(hosts=0).values() == [10, 20]
