"""Point: one position inside an Extent (what ``current_rank()`` returns).

A Point is identified by its row-major ``rank`` within an extent; the
per-label coordinates are derived from it.  It is a read-only mapping so user
code can write ``point["gpus"]`` or ``dict(point)``.
"""

from __future__ import annotations

import collections.abc
import operator
from collections.abc import Iterator
from typing import TypeVar

from monarch._src.mesh.extent import Extent

__all__ = ["Point"]

_T = TypeVar("_T")


class Point(collections.abc.Mapping[str, int]):
    """Immutable mapping ``label -> coordinate`` for rank ``rank`` of ``extent``."""

    __slots__ = ("_rank", "_extent", "_coords")

    _rank: int
    _extent: Extent
    _coords: tuple[int, ...]

    def __init__(self, rank: int, extent: Extent) -> None:
        if not isinstance(extent, Extent):
            raise TypeError(f"extent must be an Extent, got {type(extent).__name__}")
        rank = operator.index(rank)
        if rank < 0:
            raise OverflowError(f"rank must be non-negative, got {rank}")
        if rank >= extent.nelements:
            raise ValueError(f"rank {rank} out of range for extent {extent}")
        sizes = extent.sizes
        coords = [0] * len(sizes)
        rem = rank
        for d in range(len(sizes) - 1, -1, -1):
            rem, coords[d] = divmod(rem, sizes[d])
        self._rank = rank
        self._extent = extent
        self._coords = tuple(coords)

    @property
    def rank(self) -> int:
        """Row-major linear index of this point within its extent."""
        return self._rank

    @property
    def extent(self) -> Extent:
        """The extent this point is a position in."""
        return self._extent

    @property
    def coords(self) -> list[int]:
        """Coordinates in label order."""
        return list(self._coords)

    def size(self, label: str) -> int:
        """Size of dimension ``label`` of the extent this point lives in."""
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        return self._coords[self._extent.position(label)]

    def __contains__(self, label: object) -> bool:
        return label in self._extent

    def get(self, label: str, default: _T | None = None) -> int | _T | None:  # type: ignore[override]
        """Coordinate along ``label``, or ``default`` when the extent has no such dimension."""
        if label in self._extent:
            return self[label]
        return default

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Point):
            return NotImplemented
        return self._rank == other._rank and self._extent == other._extent

    def __hash__(self) -> int:
        return hash((self._rank, self._extent))

    def __reduce__(self) -> tuple[type[Point], tuple[int, Extent]]:
        return (Point, (self._rank, self._extent))

    def __repr__(self) -> str:
        parts = (
            f"{label!r}: {c}/{s}"
            for label, c, s in zip(self._extent.labels, self._coords, self._extent.sizes)
        )
        return "{" + ", ".join(parts) + "}"

    __str__ = __repr__
