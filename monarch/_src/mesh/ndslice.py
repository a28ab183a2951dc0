"""Strided N-dimensional views over a flat list of base ranks.

A :class:`Slice` is the arithmetic core of every mesh: meshes never copy the
list of processes/values they address, they describe a subset of it with an
``offset`` and per-dimension ``sizes``/``strides``.  Slicing a mesh only makes
a new Slice whose base ranks still index the original list, which is why a
sliced ActorMesh keeps addressing the right processes.

Iteration and ``get`` sit on the message-sending hot path, so the common dense
row-major case is answered with plain ``range`` arithmetic and other layouts
cache what they need on first use.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import SupportsIndex, overload

__all__ = ["Slice", "NDSlice"]


def _as_uint(value: SupportsIndex, what: str) -> int:
    """Validate a non-negative int; negatives raise ``OverflowError`` like Rust's ``usize``.

    Typed as ``SupportsIndex`` (what the callers promise); anything else passed at run time
    still gets the ``TypeError`` below.
    """
    if type(value) is not int:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{what} must be an int, got {type(value).__name__}") from None
    assert isinstance(value, int)
    if value < 0:
        raise OverflowError(f"{what} must be non-negative, got {value}")
    return value


def _row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Strides of a dense row-major layout with innermost stride 1."""
    strides = [0] * len(sizes)
    acc = 1
    for d in range(len(sizes) - 1, -1, -1):
        strides[d] = acc
        acc *= sizes[d]
    return tuple(strides)


class Slice:
    """An immutable strided view: base rank of coordinates ``c`` is ``offset + sum(c[d] * strides[d])``.

    Linear ("local") indices enumerate coordinates in row-major order; base ranks
    are positions in whatever flat list the owning mesh addresses.
    """

    __slots__ = (
        "_offset",
        "_sizes",
        "_strides",
        "_len",
        "_contiguous",
        "_nested_order",
        "_ranks",
        "_inverse",
        "_hash",
    )

    _offset: int
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]
    _len: int
    _contiguous: bool
    _nested_order: tuple[int, ...] | None
    _ranks: tuple[int, ...] | None
    _inverse: dict[int, int] | None
    _hash: int | None

    def __init__(self, *, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        sizes_t = tuple(_as_uint(s, "size") for s in sizes)
        strides_t = tuple(_as_uint(s, "stride") for s in strides)
        if len(sizes_t) != len(strides_t):
            raise ValueError(
                f"sizes and strides must have the same length, got {len(sizes_t)} sizes "
                f"and {len(strides_t)} strides"
            )
        self._offset = _as_uint(offset, "offset")
        self._sizes = sizes_t
        self._strides = strides_t
        n = 1
        for s in sizes_t:
            n *= s
        self._len = n
        self._contiguous = self._compute_contiguous()
        self._nested_order = self._compute_nested_order()
        self._ranks = None
        self._inverse = None
        self._hash = None

    # -- layout analysis -------------------------------------------------

    def _compute_contiguous(self) -> bool:
        """True when base ranks are exactly ``range(offset, offset + len)`` in row-major order."""
        if self._len == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self._sizes), reversed(self._strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def _compute_nested_order(self) -> tuple[int, ...] | None:
        """Dims (size > 1) by decreasing stride, if each stride exceeds the span of the smaller ones.

        When this holds, greedy division inverts a base rank exactly; otherwise
        :meth:`index` falls back to a lookup table.
        """
        dims = [d for d, s in enumerate(self._sizes) if s > 1]
        dims.sort(key=lambda d: self._strides[d])
        span = 0  # largest offset reachable by the dims already visited
        for d in dims:
            stride = self._strides[d]
            if stride <= span:
                return None
            span += (self._sizes[d] - 1) * stride
        dims.reverse()
        return tuple(dims)

    # -- constructors ----------------------------------------------------

    @classmethod
    def new_row_major(cls, sizes: Sequence[int]) -> Slice:
        """Dense row-major slice at offset 0: the layout of a freshly created mesh."""
        sizes_t = tuple(sizes)
        return cls(offset=0, sizes=sizes_t, strides=_row_major_strides(sizes_t))

    @classmethod
    def from_list(cls, ranks: Iterable[int]) -> Slice:
        """Build a slice whose iteration yields exactly ``ranks`` (in that order).

        Dimensions are found innermost first, always taking the longest
        arithmetic run, so dense lists collapse into one dimension.  Raises
        ``ValueError`` when no strided layout produces the list.
        """
        items = [_as_uint(r, "rank") for r in ranks]
        if not items:
            return cls(offset=0, sizes=[0], strides=[1])
        if len(set(items)) != len(items):
            raise ValueError(f"ranks {items} contain duplicates")
        sizes: list[int] = []
        strides: list[int] = []
        level = items
        while len(level) > 1:
            step = level[1] - level[0]
            if step <= 0:
                raise ValueError(f"ranks {items} cannot be expressed as a strided slice")
            run = 2
            while run < len(level) and level[run] - level[run - 1] == step:
                run += 1
            if len(level) % run != 0:
                raise ValueError(f"ranks {items} cannot be expressed as a strided slice")
            for start in range(0, len(level), run):
                base = level[start]
                for k in range(1, run):
                    if level[start + k] != base + k * step:
                        raise ValueError(f"ranks {items} cannot be expressed as a strided slice")
            sizes.append(run)
            strides.append(step)
            level = level[::run]
        if not sizes:
            return cls(offset=level[0], sizes=[1], strides=[1])
        sizes.reverse()
        strides.reverse()
        return cls(offset=level[0], sizes=sizes, strides=strides)

    # -- properties --------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self._sizes)

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        return list(self._strides)

    @property
    def is_contiguous(self) -> bool:
        """True for a dense row-major block ``range(offset, offset + len(self))``."""
        return self._contiguous

    # -- forward mapping: local index / coordinates -> base rank ----------

    def __len__(self) -> int:
        return self._len

    def _all_ranks(self) -> tuple[int, ...]:
        """Every base rank in row-major order, computed once per (immutable) slice."""
        ranks = self._ranks
        if ranks is None:
            acc = [self._offset]
            for size, stride in zip(self._sizes, self._strides):
                acc = [b + i * stride for b in acc for i in range(size)]
            ranks = tuple(acc)
            self._ranks = ranks
        return ranks

    def __iter__(self) -> Iterator[int]:
        if self._contiguous:
            return iter(range(self._offset, self._offset + self._len))
        return iter(self._all_ranks())

    def get(self, index: int) -> int:
        """Base rank of the ``index``-th element in row-major order (``ValueError`` if out of range)."""
        index = _as_uint(index, "index")
        if index >= self._len:
            raise ValueError(f"index {index} out of range for slice of size {self._len}")
        if self._contiguous:
            return self._offset + index
        rank = self._offset
        for size, stride in zip(reversed(self._sizes), reversed(self._strides)):
            index, coord = divmod(index, size)
            rank += coord * stride
        return rank

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        """Sequence-style access: negative indices count from the end; out of range is ``IndexError``."""
        if isinstance(index, slice):
            return [self.get(i) for i in range(*index.indices(self._len))]
        i = operator.index(index)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"index {index} out of range for slice of size {self._len}")
        return self.get(i)

    def nditem(self, coords: Sequence[int]) -> int:
        """Base rank at the given per-dimension coordinates."""
        if len(coords) != len(self._sizes):
            raise ValueError(f"expected {len(self._sizes)} coordinates, got {len(coords)}")
        rank = self._offset
        for d, (c, size, stride) in enumerate(zip(coords, self._sizes, self._strides)):
            c = _as_uint(c, "coordinate")
            if c >= size:
                raise ValueError(f"coordinate {c} out of range for dimension {d} of size {size}")
            rank += c * stride
        return rank

    # -- inverse mapping: base rank -> local index / coordinates ----------

    def index(self, value: int) -> int:
        """Row-major position of base rank ``value`` (``ValueError`` if it is not in the slice)."""
        if self._contiguous:
            pos = value - self._offset
            if 0 <= pos < self._len:
                return pos
            raise ValueError(f"value {value} not in slice")
        if self._nested_order is not None:
            coords = self._greedy_coords(value)
            if coords is None:
                raise ValueError(f"value {value} not in slice")
            pos = 0
            for c, size in zip(coords, self._sizes):
                pos = pos * size + c
            return pos
        inverse = self._inverse
        if inverse is None:
            inverse = {}
            for pos, rank in enumerate(self._all_ranks()):
                inverse.setdefault(rank, pos)
            self._inverse = inverse
        try:
            return inverse[value]
        except KeyError:
            raise ValueError(f"value {value} not in slice") from None

    def _greedy_coords(self, value: int) -> list[int] | None:
        """Exact inverse for nested layouts (see ``_compute_nested_order``)."""
        if self._len == 0:
            return None
        rem = value - self._offset
        if rem < 0:
            return None
        coords = [0] * len(self._sizes)
        assert self._nested_order is not None
        for d in self._nested_order:
            c = rem // self._strides[d]
            if c >= self._sizes[d]:
                return None
            coords[d] = c
            rem -= c * self._strides[d]
        return coords if rem == 0 else None

    def coordinates(self, value: int) -> list[int]:
        """Per-dimension coordinates of base rank ``value`` (``ValueError`` if not in the slice)."""
        pos = self.index(value)
        coords = [0] * len(self._sizes)
        for d in range(len(self._sizes) - 1, -1, -1):
            pos, coords[d] = divmod(pos, self._sizes[d])
        return coords

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        try:
            self.index(value)
        except ValueError:
            return False
        return True

    # -- value semantics ---------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Slice):
            return NotImplemented
        return (
            self._offset == other._offset and self._sizes == other._sizes and self._strides == other._strides
        )

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = self._hash = hash((self._offset, self._sizes, self._strides))
        return h

    def __reduce__(self) -> tuple[object, tuple[int, tuple[int, ...], tuple[int, ...]]]:
        return (_make_slice, (self._offset, self._sizes, self._strides))

    def __repr__(self) -> str:
        return f"Slice(offset={self._offset}, sizes={list(self._sizes)}, strides={list(self._strides)})"


def _make_slice(offset: int, sizes: Sequence[int], strides: Sequence[int]) -> Slice:
    """Unpickling helper: the constructor is keyword-only."""
    return Slice(offset=offset, sizes=sizes, strides=strides)


NDSlice = Slice
