"""ValueMesh: one value per rank of a mesh (what ``endpoint.call()`` returns).

Values are stored densely in the row-major order of the mesh's *local* ranks,
not by base rank, so a ValueMesh over a sliced mesh stores exactly as many
values as it has points.  Slicing maps every base rank of the new shape back to
its position in the old one.
"""

from __future__ import annotations

import operator
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from monarch._src.mesh.mesh_trait import MeshTrait
from monarch._src.mesh.point import Point
from monarch._src.mesh.shape import Shape

__all__ = ["ValueMesh"]

R = TypeVar("R")


class ValueMesh(MeshTrait, Generic[R]):
    """An immutable mesh of values, ``values[i]`` belonging to the i-th rank of ``shape``."""

    def __init__(self, shape: Shape, values: Sequence[R]) -> None:
        if not isinstance(shape, Shape):
            raise TypeError(f"shape must be a Shape, got {type(shape).__name__}")
        values_l = list(values)
        if len(values_l) != len(shape):
            raise ValueError(f"expected {len(shape)} values for shape {shape}, got {len(values_l)}")
        self._value_shape = shape
        self._values = values_l

    def __class_getitem__(cls, item: Any) -> type[ValueMesh[Any]]:
        """``ValueMesh[int] is ValueMesh`` at runtime; the parameter is for type checkers only."""
        return cls

    @classmethod
    def from_indexed(cls, shape: Shape, pairs: Iterable[tuple[int, R]]) -> ValueMesh[R]:
        """Build from ``(local_rank, value)`` pairs in any order; the last write for a rank wins."""
        n = len(shape)
        missing = object()
        values: list[Any] = [missing] * n
        filled = 0
        for rank, value in pairs:
            i = operator.index(rank)
            if not 0 <= i < n:
                raise ValueError(f"index {i} out of range for ValueMesh of size {n}")
            if values[i] is missing:
                filled += 1
            values[i] = value
        if filled != n:
            raise ValueError(f"expected {n} values for shape {shape}, but input contains {filled}")
        return cls(shape, values)

    # -- MeshTrait -------------------------------------------------------------

    @property
    def _shape(self) -> Shape:
        return self._value_shape

    def _new_with_shape(self, shape: Shape) -> ValueMesh[R]:
        old = self._value_shape.ndslice
        values = self._values
        new = shape.ndslice
        if old.is_contiguous:
            # Dense old layout: position is just base rank minus offset.  Strides are
            # non-negative, so the new slice's ranks span [offset, offset + reach].
            base = old.offset
            if len(new):
                reach = sum((n - 1) * st for n, st in zip(new.sizes, new.strides))
                if new.offset < base or new.offset + reach - base >= len(values):
                    raise ValueError(f"shape {shape} is not contained in {self._value_shape}")
            new_values = [values[r - base] for r in new]
        else:
            try:
                new_values = [values[old.index(r)] for r in new]
            except ValueError:
                raise ValueError(f"shape {shape} is not contained in {self._value_shape}") from None
        return ValueMesh(shape, new_values)

    # -- access ------------------------------------------------------------------

    def values(self) -> list[R]:
        """All values in rank order."""
        return list(self._values)

    def get(self, rank: int) -> R:
        """Value of local rank ``rank`` (``ValueError`` when out of range)."""
        i = operator.index(rank)
        n = len(self._values)
        if not 0 <= i < n:
            raise ValueError(f"index {i} out of range for ValueMesh of size {n}")
        return self._values[i]

    def items(self) -> Iterator[tuple[Point, R]]:
        """``(Point, value)`` pairs in rank order."""
        extent = self._value_shape.extent
        for i, value in enumerate(self._values):
            yield Point(i, extent), value

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return self.items()

    def item(self, **kwargs: int) -> R:
        """Value at the given coordinates; every label must be given (none for a 0-dim mesh)."""
        shape = self._value_shape
        coords = [kwargs.pop(label) for label in shape.labels]
        if kwargs:
            raise KeyError(f"item has extra dimensions: {list(kwargs.keys())}")
        pos = 0
        for label, c, size in zip(shape.labels, coords, shape.ndslice.sizes):
            c = operator.index(c)
            if not 0 <= c < size:
                raise ValueError(f"coordinate {c} out of range for dimension '{label}' of size {size}")
            pos = pos * size + c
        return self._values[pos]

    # -- value semantics -----------------------------------------------------------

    def __reduce__(self) -> tuple[type[ValueMesh[Any]], tuple[Shape, list[R]]]:
        return (ValueMesh, (self._value_shape, self._values))

    def __repr__(self) -> str:
        from pprint import pformat

        body = textwrap.indent(pformat(tuple(self.items())), "  ")
        return f"ValueMesh({self._value_shape.extent}):\n{body}"
