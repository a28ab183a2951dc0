"""MeshTrait: slice/split/flatten/rename/size on a minimal mesh over a fixed process list.

``FakeMesh`` mimics how ActorMesh uses MeshTrait: it keeps the original list of
"procs" and only swaps its Shape, so the base ranks of every derived shape must
keep pointing at the right entries of that list.
"""

from __future__ import annotations

import pytest

from monarch._src.mesh.extent import Extent
from monarch._src.mesh.mesh_trait import MeshTrait
from monarch._src.mesh.ndslice import Slice
from monarch._src.mesh.shape import Shape


class FakeMesh(MeshTrait):
    def __init__(self, shape: Shape, procs: list[str]) -> None:
        self._the_shape = shape
        self._procs = procs

    @property
    def _shape(self) -> Shape:
        return self._the_shape

    def _new_with_shape(self, shape: Shape) -> FakeMesh:
        return FakeMesh(shape, self._procs)

    def procs(self) -> list[str]:
        return [self._procs[r] for r in self._shape.ranks()]


def mesh(**sizes: int) -> FakeMesh:
    extent = Extent(list(sizes), list(sizes.values()))
    n = extent.nelements
    return FakeMesh(Shape.from_extent(extent), [f"p{i}" for i in range(n)])


def test_abstract() -> None:
    with pytest.raises(TypeError):
        MeshTrait()  # type: ignore[abstract]


def test_len_size_sizes_extent() -> None:
    m = mesh(hosts=2, gpus=4)
    assert len(m) == 8
    assert m.size() == 8
    assert m.size("gpus") == 4
    assert m.size(["hosts", "gpus"]) == 8
    assert m.size(("hosts",)) == 2
    assert m.sizes == {"hosts": 2, "gpus": 4}
    assert m.extent == Extent(["hosts", "gpus"], [2, 4])
    with pytest.raises(KeyError):
        m.size("x")
    with pytest.raises(KeyError):
        m.size(["hosts", "x"])


def test_slice_int_removes_dimension() -> None:
    m = mesh(hosts=2, gpus=4)
    s = m.slice(hosts=1, gpus=2)
    assert len(s) == 1
    assert s._shape.ranks() == [6]
    assert s.procs() == ["p6"]
    assert s.sizes == {}
    g = m.slice(gpus=1)
    assert g.sizes == {"hosts": 2}
    assert g.procs() == ["p1", "p5"]


def test_slice_range_keeps_dimension() -> None:
    m = mesh(hosts=2, gpus=4)
    s = m.slice(gpus=slice(1, 3))
    assert s.sizes == {"hosts": 2, "gpus": 2}
    assert s.procs() == ["p1", "p2", "p5", "p6"]
    assert m.slice(gpus=slice(None, None, 2)).procs() == ["p0", "p2", "p4", "p6"]
    assert m.slice(gpus=slice(-2, None)).procs() == ["p2", "p3", "p6", "p7"]


def test_slice_of_slice() -> None:
    m = mesh(hosts=2, gpus=4)
    s = m.slice(gpus=slice(1, 4)).slice(gpus=slice(1, 3), hosts=1)
    assert s.procs() == ["p6", "p7"]
    assert s._shape.ndslice == Slice(offset=6, sizes=[2], strides=[1])
    assert s.slice(gpus=1).procs() == ["p7"]


def test_slice_errors() -> None:
    m = mesh(hosts=2, gpus=4)
    with pytest.raises(TypeError, match=r"^Shape does not have dimension labeled 'x'$"):
        m.slice(x=0)
    with pytest.raises(IndexError, match=r"^index out of range$"):
        m.slice(gpus=4)
    with pytest.raises(IndexError, match=r"^index out of range$"):
        m.slice(gpus=-1)
    with pytest.raises(ValueError):
        m.slice(gpus=slice(None, None, -1))


def test_flatten_dense() -> None:
    m = mesh(hosts=2, gpus=4)
    f = m.flatten("r")
    assert f.sizes == {"r": 8}
    assert f._shape.ndslice == Slice(offset=0, sizes=[8], strides=[1])
    assert f.slice(r=5).procs() == ["p5"]
    h = m.slice(hosts=1).flatten("r")
    assert h.procs() == ["p4", "p5", "p6", "p7"]


def test_flatten_sliced_then() -> None:
    m = mesh(hosts=2, gpus=4)
    s = m.slice(gpus=slice(1, 3))
    with pytest.raises(ValueError, match=r"^cannot flatten sparse mesh: "):
        s.flatten("r")
    # Dropping a dimension of a dense mesh keeps a single strided run: flattenable.
    g = m.slice(gpus=slice(1, 2)).flatten("r")
    assert g.procs() == ["p1", "p5"]
    assert g._shape.ndslice == Slice(offset=1, sizes=[2], strides=[4])
    assert m.slice(gpus=slice(None, None, 2)).flatten("r").procs() == ["p0", "p2", "p4", "p6"]


def test_split() -> None:
    m = mesh(hosts=2, gpus=4)
    s = m.split(gpus=("tp", "cp"), cp=2)
    assert s.sizes == {"hosts": 2, "tp": 2, "cp": 2}
    assert s._shape.ndslice == Slice(offset=0, sizes=[2, 2, 2], strides=[4, 2, 1])
    assert s.procs() == m.procs()
    assert s.slice(cp=1).procs() == ["p1", "p3", "p5", "p7"]
    assert s.slice(tp=1, hosts=0).procs() == ["p2", "p3"]
    inferred = m.split(gpus=("tp", "cp"), tp=4)
    assert inferred.sizes == {"hosts": 2, "tp": 4, "cp": 1}


def test_split_big_example() -> None:
    m = mesh(host=32, gpu=8)
    s = m.split(host=("dp", "pp"), gpu=("tp", "cp"), pp=16, cp=2)
    assert s.sizes == {"dp": 2, "pp": 16, "tp": 4, "cp": 2}
    assert len(s) == 256
    assert s.slice(dp=1, pp=0, tp=0, cp=1).procs() == [f"p{16 * 8 + 1}"]


def test_split_of_slice_keeps_base_ranks() -> None:
    m = mesh(hosts=2, gpus=8)
    s = m.slice(hosts=1, gpus=slice(0, 8, 2)).split(gpus=("a", "b"), b=2)
    assert s.sizes == {"a": 2, "b": 2}
    assert s.procs() == ["p8", "p10", "p12", "p14"]
    assert s.slice(a=1).procs() == ["p12", "p14"]


def test_split_errors() -> None:
    m = mesh(hosts=2, gpus=4)
    with pytest.raises(ValueError, match="is not evenly divided"):
        m.split(gpus=("tp", "cp"), cp=3)
    with pytest.raises(ValueError, match="is not evenly divided"):
        m.split(gpus=("tp", "cp"), tp=2, cp=3)
    with pytest.raises(ValueError, match="^Cannot infer size"):
        m.split(gpus=("tp", "cp"))
    with pytest.raises(ValueError, match="Duplicate dimension name"):
        m.split(gpus=("hosts", "cp"), cp=2)
    with pytest.raises(ValueError, match="Duplicate dimension name"):
        m.split(gpus=("a", "a"), a=2)
    with pytest.raises(ValueError, match="unused size constraints"):
        m.split(gpus=("tp", "cp"), cp=2, zz=4)
    with pytest.raises(TypeError):
        m.split(nope=("a", "b"), a=1)


def test_rename() -> None:
    m = mesh(hosts=2, gpus=4)
    r = m.rename(gpus="g")
    assert r.sizes == {"hosts": 2, "g": 4}
    assert r.slice(g=3).procs() == ["p3", "p7"]
    swapped = m.rename(hosts="gpus", gpus="hosts")
    assert swapped.sizes == {"gpus": 2, "hosts": 4}
    with pytest.raises(ValueError, match="Duplicate dimension name"):
        m.rename(gpus="hosts")
