"""Extent and Point: mapping behaviour, exact reprs, equality and pickling."""

import collections.abc
import pickle

import pytest

from monarch._src.mesh.extent import Extent
from monarch._src.mesh.point import Point


def test_extent_mapping() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert isinstance(e, collections.abc.Mapping)
    assert e.labels == ["hosts", "gpus"]
    assert e.sizes == [2, 4]
    assert e.nelements == 8
    assert e["gpus"] == 4
    assert list(e) == ["hosts", "gpus"]
    assert list(e.keys()) == ["hosts", "gpus"]
    assert dict(e) == {"hosts": 2, "gpus": 4}
    assert len(e) == 2
    assert "gpus" in e
    assert "x" not in e
    assert e.get("x") is None
    assert e.get("x", 7) == 7


def test_extent_missing_label() -> None:
    e = Extent(["hosts"], [2])
    with pytest.raises(ValueError, match=r"^Dimension 'x' not found$"):
        e["x"]


def test_extent_repr() -> None:
    assert str(Extent(["hosts", "gpus"], [2, 4])) == "{hosts: 2, gpus: 4}"
    assert repr(Extent(["hosts", "gpus"], [2, 4])) == "{hosts: 2, gpus: 4}"
    assert str(Extent([], [])) == "{}"
    assert str(Extent(["a-b", "c_1"], [1, 3])) == '{"a-b": 1, c_1: 3}'


def test_extent_eq_hash_pickle() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert e == Extent(["hosts", "gpus"], [2, 4])
    assert hash(e) == hash(Extent(["hosts", "gpus"], [2, 4]))
    assert e != Extent(["gpus", "hosts"], [4, 2])
    assert e != Extent(["hosts", "gpus"], [2, 3])
    e2 = pickle.loads(pickle.dumps(e))
    assert e2 == e and e2.labels == ["hosts", "gpus"]
    assert Extent([], []).nelements == 1


def test_extent_validation() -> None:
    with pytest.raises(ValueError):
        Extent(["a", "b"], [1])
    with pytest.raises(ValueError):
        Extent(["a", "a"], [1, 2])


def test_point_coordinates_row_major() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    p = Point(6, e)
    assert p.rank == 6
    assert p.extent == e
    assert p["hosts"] == 1
    assert p["gpus"] == 2
    assert dict(p) == {"hosts": 1, "gpus": 2}
    assert list(p) == ["hosts", "gpus"]
    assert list(p.keys()) == ["hosts", "gpus"]
    assert len(p) == 2
    assert p.size("gpus") == 4
    assert "gpus" in p and "x" not in p
    with pytest.raises(ValueError, match="Dimension 'x' not found"):
        p["x"]


def test_point_repr() -> None:
    e = Extent(["hosts", "gpus"], [1, 2])
    assert str(Point(0, e)) == "{'hosts': 0/1, 'gpus': 0/2}"
    assert str(Point(1, e)) == "{'hosts': 0/1, 'gpus': 1/2}"
    assert repr(Point(1, e)) == "{'hosts': 0/1, 'gpus': 1/2}"
    z = Point(0, Extent([], []))
    assert repr(z) == "{}"
    assert len(z) == 0


def test_point_eq_hash_pickle() -> None:
    e = Extent(["hosts", "gpus"], [2, 2])
    p = Point(3, e)
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p)
    assert p != Point(2, e)
    assert p != Point(3, Extent(["hosts", "gpus"], [2, 4]))
    assert [Point(i, e) for i in range(4)] == pickle.loads(pickle.dumps([Point(i, e) for i in range(4)]))


def test_point_rank_validation() -> None:
    e = Extent(["gpus"], [2])
    with pytest.raises(ValueError):
        Point(2, e)
    with pytest.raises(OverflowError):
        Point(-1, e)
