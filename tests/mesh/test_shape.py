"""Shape: extent/ranks/coordinates and the at/select/index restrictions."""

import pickle

import pytest

from monarch._src.mesh.extent import Extent
from monarch._src.mesh.ndslice import Slice
from monarch._src.mesh.shape import Shape


def hg() -> Shape:
    return Shape(["hosts", "gpus"], Slice.new_row_major([2, 4]))


def test_basics() -> None:
    s = hg()
    assert s.labels == ["hosts", "gpus"]
    assert s.ndslice == Slice(offset=0, sizes=[2, 4], strides=[4, 1])
    assert s.extent == Extent(["hosts", "gpus"], [2, 4])
    assert s.ranks() == list(range(8))
    assert len(s) == 8
    assert s.coordinates(6) == {"hosts": 1, "gpus": 2}
    assert str(s) == "{hosts=2,gpus=4}"
    assert Shape.from_extent(Extent(["hosts", "gpus"], [2, 4])) == s


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        Shape(["a"], Slice.new_row_major([2, 2]))
    with pytest.raises(ValueError):
        Shape(["a", "a"], Slice.new_row_major([2, 2]))


def test_at() -> None:
    s = hg().at("gpus", 2)
    assert s.labels == ["hosts"]
    assert s.ndslice == Slice(offset=2, sizes=[2], strides=[4])
    assert s.ranks() == [2, 6]
    assert hg().at("hosts", 1).ranks() == [4, 5, 6, 7]


def test_at_errors() -> None:
    with pytest.raises(ValueError):
        hg().at("x", 0)
    with pytest.raises(ValueError):
        hg().at("gpus", 4)
    with pytest.raises(OverflowError):
        hg().at("gpus", -1)


def test_select() -> None:
    s = hg().select("gpus", slice(1, 3))
    assert s.labels == ["hosts", "gpus"]
    assert s.ndslice == Slice(offset=1, sizes=[2, 2], strides=[4, 1])
    assert s.ranks() == [1, 2, 5, 6]
    t = hg().select("gpus", slice(None, None, 2))
    assert t.ranks() == [0, 2, 4, 6]
    assert t.ndslice.strides == [4, 2]
    assert hg().select("gpus", slice(1, None, 2)).ranks() == [1, 3, 5, 7]
    assert hg().select("gpus", slice(0, 3, 2)).ranks() == [0, 2, 4, 6]
    assert len(hg().select("gpus", slice(3, 1))) == 0
    with pytest.raises(ValueError):
        hg().select("x", slice(0, 1))


def test_slice_of_slice_ranks() -> None:
    s = hg().select("gpus", slice(1, 4)).select("gpus", slice(1, 3)).at("hosts", 1)
    assert s.ranks() == [6, 7]
    assert s.coordinates(7) == {"gpus": 1}


def test_index() -> None:
    s = hg().index(hosts=1, gpus=2)
    assert s.labels == []
    assert s.ranks() == [6]
    assert str(s) == "{}"
    assert hg().index(gpus=1).ranks() == [1, 5]


def test_unity() -> None:
    u = Shape.unity()
    assert u.labels == []
    assert u.ranks() == [0]
    assert len(u) == 1
    assert u.extent == Extent([], [])
    assert u.ndslice.offset == 0


def test_eq_hash_pickle() -> None:
    s = hg().select("gpus", slice(1, 3))
    t = pickle.loads(pickle.dumps(s))
    assert t == s and hash(t) == hash(s)
    assert t.ranks() == [1, 2, 5, 6]
    assert s != hg()
    assert hg() != Shape(["h", "g"], Slice.new_row_major([2, 4]))
