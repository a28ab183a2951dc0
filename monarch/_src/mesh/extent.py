"""Extent: the labelled sizes of a mesh, without any placement information.

An Extent is what a user sees as the "shape" of a mesh (``{hosts: 2, gpus: 4}``)
and what a Point's coordinates are relative to.  It deliberately carries no
offset/strides: two meshes with the same extent look the same to user code even
if they address different base ranks.
"""

from __future__ import annotations

import collections.abc
import re
from collections.abc import Iterator, Sequence
from typing import TypeVar

__all__ = ["Extent"]

_T = TypeVar("_T")
_PLAIN_LABEL = re.compile(r"[A-Za-z0-9_]+")


def format_label(label: str) -> str:
    """Labels are printed bare when they are simple identifiers, quoted otherwise."""
    if _PLAIN_LABEL.fullmatch(label):
        return label
    escaped = label.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def label_index(labels: tuple[str, ...]) -> dict[str, int]:
    """Dimension name -> position; names must be distinct strings (Extent and Shape share it)."""
    index: dict[str, int] = {}
    for i, label in enumerate(labels):
        if not isinstance(label, str):
            raise TypeError(f"labels must be str, got {type(label).__name__}")
        if label in index:
            raise ValueError(f"Duplicate dimension name '{label}'")
        index[label] = i
    return index


class Extent(collections.abc.Mapping[str, int]):
    """Immutable ordered mapping ``label -> size``.

    Looking up an unknown label raises ``ValueError("Dimension 'x' not found")``
    (matching Monarch), while ``'x' in extent`` and ``extent.get('x')`` behave
    like an ordinary mapping.
    """

    __slots__ = ("_labels", "_sizes", "_index", "_nelements")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _index: dict[str, int]
    _nelements: int

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        labels_t = tuple(labels)
        sizes_t = tuple(int(s) for s in sizes)
        if len(labels_t) != len(sizes_t):
            raise ValueError(
                f"labels and sizes must have the same length, got {len(labels_t)} labels "
                f"and {len(sizes_t)} sizes"
            )
        index = label_index(labels_t)
        for s in sizes_t:
            if s < 0:
                raise OverflowError(f"size must be non-negative, got {s}")
        n = 1
        for s in sizes_t:
            n *= s
        self._labels = labels_t
        self._sizes = sizes_t
        self._index = index
        self._nelements = n

    @property
    def labels(self) -> list[str]:
        """Dimension names, outermost first."""
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        """Dimension sizes, in the order of ``labels``."""
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        """Number of points, i.e. the product of the sizes (1 for a 0-dim extent)."""
        return self._nelements

    def position(self, label: str) -> int:
        """Dimension index of ``label`` (``ValueError`` if absent)."""
        try:
            return self._index[label]
        except (KeyError, TypeError):
            raise ValueError(f"Dimension '{label}' not found") from None

    def __getitem__(self, label: str) -> int:
        return self._sizes[self.position(label)]

    def __contains__(self, label: object) -> bool:
        try:
            return label in self._index
        except TypeError:
            return False

    def get(self, label: str, default: _T | None = None) -> int | _T | None:  # type: ignore[override]
        """Size of dimension ``label``, or ``default`` when the extent has no such dimension."""
        i = self._index.get(label) if isinstance(label, str) else None
        return default if i is None else self._sizes[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Extent):
            return NotImplemented
        return self._labels == other._labels and self._sizes == other._sizes

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __reduce__(self) -> tuple[type[Extent], tuple[list[str], list[int]]]:
        return (Extent, (list(self._labels), list(self._sizes)))

    def __repr__(self) -> str:
        body = ", ".join(f"{format_label(label)}: {s}" for label, s in zip(self._labels, self._sizes))
        return "{" + body + "}"

    __str__ = __repr__
