"""Slice/NDSlice arithmetic: forward and inverse rank mapping, from_list, pickling."""

import pickle

import pytest

from monarch._src.mesh.ndslice import NDSlice, Slice


def test_alias() -> None:
    assert NDSlice is Slice


def test_row_major_basics() -> None:
    s = Slice.new_row_major([2, 3, 4])
    assert s.ndim == 3
    assert s.offset == 0
    assert s.sizes == [2, 3, 4]
    assert s.strides == [12, 4, 1]
    assert len(s) == 24
    assert list(s) == list(range(24))
    assert s.is_contiguous


def test_keyword_only_constructor() -> None:
    with pytest.raises(TypeError):
        Slice(0, [2], [1])  # type: ignore[misc]


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        Slice(offset=0, sizes=[2, 2], strides=[1])
    with pytest.raises(OverflowError):
        Slice(offset=-1, sizes=[2], strides=[1])
    with pytest.raises(OverflowError):
        Slice(offset=0, sizes=[2], strides=[-1])


def test_strided_iteration_and_get() -> None:
    s = Slice(offset=1, sizes=[2, 2], strides=[4, 2])
    assert list(s) == [1, 3, 5, 7]
    assert [s.get(i) for i in range(4)] == [1, 3, 5, 7]
    assert [s[i] for i in range(4)] == [1, 3, 5, 7]
    assert s[-1] == 7
    assert s[1:3] == [3, 5]
    assert not s.is_contiguous


def test_get_out_of_range() -> None:
    s = Slice(offset=5, sizes=[2], strides=[2])
    assert list(s) == [5, 7]
    with pytest.raises(ValueError, match="out of range"):
        s.get(2)
    with pytest.raises(IndexError):
        s[2]
    with pytest.raises(IndexError):
        s[-3]


def test_index_and_coordinates_inverse() -> None:
    s = Slice(offset=3, sizes=[2, 3], strides=[10, 2])
    for pos, rank in enumerate(s):
        assert s.index(rank) == pos
        coords = s.coordinates(rank)
        assert coords == [pos // 3, pos % 3]
        assert s.nditem(coords) == rank
    for bad in (0, 4, 9, 19, 100):
        with pytest.raises(ValueError):
            s.index(bad)
        with pytest.raises(ValueError):
            s.coordinates(bad)
        assert bad not in s
    assert 15 in s


def test_index_non_nested_layout() -> None:
    # Transposed layout: iteration order is not sorted; inverse must still work.
    s = Slice(offset=0, sizes=[2, 2], strides=[1, 2])
    assert list(s) == [0, 2, 1, 3]
    assert [s.index(r) for r in (0, 2, 1, 3)] == [0, 1, 2, 3]
    # Interleaved (non-nested) layout: strides 3 and 2 overlap in span.
    t = Slice(offset=0, sizes=[2, 3], strides=[3, 2])
    assert list(t) == [0, 2, 4, 3, 5, 7]
    assert [t.index(r) for r in t] == list(range(6))
    with pytest.raises(ValueError):
        t.index(1)


def test_index_contiguous_with_offset() -> None:
    s = Slice(offset=4, sizes=[1, 4], strides=[4, 1])
    assert s.is_contiguous
    assert s.index(6) == 2
    with pytest.raises(ValueError):
        s.index(3)
    with pytest.raises(ValueError):
        s.index(8)


def test_nditem_validation() -> None:
    s = Slice.new_row_major([2, 3])
    assert s.nditem([1, 2]) == 5
    with pytest.raises(ValueError):
        s.nditem([2, 0])
    with pytest.raises(ValueError):
        s.nditem([0])


def test_zero_dim_and_empty() -> None:
    z = Slice(offset=7, sizes=[], strides=[])
    assert len(z) == 1
    assert list(z) == [7]
    assert z.index(7) == 0
    assert z.coordinates(7) == []
    e = Slice(offset=0, sizes=[0, 3], strides=[3, 1])
    assert len(e) == 0
    assert list(e) == []
    with pytest.raises(ValueError):
        e.index(0)


@pytest.mark.parametrize(
    "ranks, expected",
    [
        ([4], Slice(offset=4, sizes=[1], strides=[1])),
        ([0, 1, 2, 3], Slice(offset=0, sizes=[4], strides=[1])),
        ([1, 3, 5], Slice(offset=1, sizes=[3], strides=[2])),
        ([0, 1, 2, 10, 11, 12], Slice(offset=0, sizes=[2, 3], strides=[10, 1])),
        ([0, 2, 1, 3], Slice(offset=0, sizes=[2, 2], strides=[1, 2])),
    ],
)
def test_from_list(ranks: list[int], expected: Slice) -> None:
    s = Slice.from_list(ranks)
    assert s == expected
    assert list(s) == ranks


def test_from_list_roundtrips_arbitrary_slices() -> None:
    for s in (
        Slice(offset=3, sizes=[2, 3, 2], strides=[40, 7, 2]),
        Slice(offset=0, sizes=[3, 2], strides=[2, 7]),
    ):
        assert list(Slice.from_list(list(s))) == list(s)


@pytest.mark.parametrize("ranks", [[0, 1, 3], [3, 2], [1, 1], [0, 1, 2, 1, 2, 3], [0, 1, 5, 6, 7]])
def test_from_list_rejects(ranks: list[int]) -> None:
    with pytest.raises(ValueError):
        Slice.from_list(ranks)


def test_eq_hash_pickle_repr() -> None:
    a = Slice(offset=5, sizes=[2], strides=[2])
    b = Slice(offset=5, sizes=[2], strides=[2])
    assert a == b and hash(a) == hash(b)
    assert a != Slice(offset=5, sizes=[2], strides=[3])
    assert pickle.loads(pickle.dumps(a)) == a
    assert list(pickle.loads(pickle.dumps(a))) == [5, 7]
    assert repr(a) == "Slice(offset=5, sizes=[2], strides=[2])"
    assert eval(repr(a)) == a
