"""Shape: labelled dimensions over a :class:`Slice` of base ranks.

A Shape is the full placement description of a mesh: the user-facing labels
and sizes (its :class:`Extent`) plus the strided mapping onto the base ranks
of the underlying list of processes/values.  All restriction operations only
touch offset/sizes/strides, so the result keeps addressing the original list.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from monarch._src.mesh.extent import Extent, label_index
from monarch._src.mesh.ndslice import Slice

__all__ = ["Shape"]

_pyslice = slice


class Shape:
    """Immutable pair of dimension labels and a Slice with one dimension per label."""

    __slots__ = ("_labels", "_slice", "_index", "_extent")

    _labels: tuple[str, ...]
    _slice: Slice
    _index: dict[str, int]
    _extent: Extent | None

    def __init__(self, labels: Sequence[str], slice: Slice) -> None:
        labels_t = tuple(labels)
        if not isinstance(slice, Slice):
            raise TypeError(f"slice must be a Slice, got {type(slice).__name__}")
        if len(labels_t) != slice.ndim:
            raise ValueError(
                f"number of labels ({len(labels_t)}) does not match slice dimensions ({slice.ndim})"
            )
        index = label_index(labels_t)
        self._labels = labels_t
        self._slice = slice
        self._index = index
        self._extent = None

    # -- constructors ------------------------------------------------------

    @staticmethod
    def from_extent(extent: Extent) -> Shape:
        """Dense row-major shape at offset 0 (the shape of a freshly created mesh)."""
        return Shape(extent.labels, Slice.new_row_major(extent.sizes))

    @staticmethod
    def unity() -> Shape:
        """The 0-dimensional shape containing only base rank 0."""
        return Shape([], Slice(offset=0, sizes=[], strides=[]))

    # -- accessors ---------------------------------------------------------

    @property
    def labels(self) -> list[str]:
        """Dimension names, outermost first."""
        return list(self._labels)

    @property
    def ndslice(self) -> Slice:
        """The strided slice that maps this shape's coordinates to ranks of the mesh it was cut from."""
        return self._slice

    @property
    def extent(self) -> Extent:
        """Labels and sizes without the rank mapping: the shape as the mesh's user sees it."""
        extent = self._extent
        if extent is None:
            extent = self._extent = Extent(self._labels, self._slice.sizes)
        return extent

    def ranks(self) -> list[int]:
        """Base ranks in row-major order of coordinates."""
        return list(self._slice)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Coordinates of base rank ``rank`` (``ValueError`` if it is not in this shape)."""
        return dict(zip(self._labels, self._slice.coordinates(rank)))

    def __len__(self) -> int:
        return len(self._slice)

    # -- restriction -------------------------------------------------------

    def _dim(self, label: str) -> int:
        try:
            return self._index[label]
        except (KeyError, TypeError):
            raise ValueError(f"Shape does not have dimension labeled '{label}'") from None

    def _at_dim(self, d: int, i: int) -> Shape:
        """Drop dimension ``d`` fixing its coordinate to ``i`` (caller has validated)."""
        s = self._slice
        sizes, strides = s.sizes, s.strides
        offset = s.offset + i * strides[d]
        del sizes[d], strides[d]
        labels = self._labels[:d] + self._labels[d + 1 :]
        return Shape(labels, Slice(offset=offset, sizes=sizes, strides=strides))

    def _select_dim(self, d: int, start: int, size: int, step: int) -> Shape:
        """Keep dimension ``d`` restricted to ``size`` coordinates ``start, start+step, ...``."""
        s = self._slice
        sizes, strides = s.sizes, s.strides
        offset = s.offset + start * strides[d]
        sizes[d] = size
        strides[d] = strides[d] * step
        return Shape(self._labels, Slice(offset=offset, sizes=sizes, strides=strides))

    def at(self, label: str, index: int) -> Shape:
        """Fix ``label`` to ``index`` and drop that dimension.

        Unknown label or index past the end -> ``ValueError``; negative index ->
        ``OverflowError`` (Monarch indices are unsigned).
        """
        d = self._dim(label)
        i = operator.index(index)
        if i < 0:
            raise OverflowError("can't convert negative int to unsigned")
        size = self._slice.sizes[d]
        if i >= size:
            raise ValueError(f"index {i} out of range for dimension '{label}' of size {size}")
        return self._at_dim(d, i)

    def select(self, label: str, slice: _pyslice) -> Shape:
        """Restrict ``label`` to a Python ``slice`` (start/stop/step), keeping the dimension."""
        d = self._dim(label)
        if not isinstance(slice, _pyslice):
            raise TypeError(f"select expects a slice, got {type(slice).__name__}")
        if slice.step is not None and operator.index(slice.step) <= 0:
            raise ValueError(f"slice step must be positive, got {slice.step}")
        start, stop, step = slice.indices(self._slice.sizes[d])
        return self._select_dim(d, start, len(range(start, stop, step)), step)

    def index(self, **kwargs: int) -> Shape:
        """Apply :meth:`at` for every ``label=index`` given."""
        shape = self
        for label, i in kwargs.items():
            shape = shape.at(label, i)
        return shape

    # -- value semantics ---------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._labels == other._labels and self._slice == other._slice

    def __hash__(self) -> int:
        return hash((self._labels, self._slice))

    def __reduce__(self) -> tuple[type[Shape], tuple[list[str], Slice]]:
        return (Shape, (list(self._labels), self._slice))

    def __str__(self) -> str:
        sizes = self._slice.sizes
        return "{" + ",".join(f"{label}={s}" for label, s in zip(self._labels, sizes)) + "}"

    def __repr__(self) -> str:
        return f"Shape(labels={list(self._labels)!r}, slice={self._slice!r})"
