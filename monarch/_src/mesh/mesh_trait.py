"""MeshTrait: the shape algebra shared by every mesh type.

ValueMesh, ActorMesh, ProcMesh and HostMesh all expose the same
``slice``/``split``/``flatten``/``rename``/``size`` operations.  Each of them
only has to say what its current :class:`Shape` is and how to build a copy of
itself over a different Shape; the arithmetic lives here once.

Every operation produces a Shape over the *same* base ranks as the original,
so the derived mesh keeps indexing the original list of processes/values.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, TypeVar

from monarch._src.mesh.extent import Extent
from monarch._src.mesh.ndslice import Slice
from monarch._src.mesh.shape import Shape

__all__ = ["MeshTrait"]

_M = TypeVar("_M", bound="MeshTrait")
_pyslice = slice


class MeshTrait(ABC):
    """Abstract mixin: implement ``_shape`` and ``_new_with_shape``; get the mesh operations."""

    __slots__ = ()

    @property
    @abstractmethod
    def _shape(self) -> Shape:
        """Current shape of this mesh."""

    @abstractmethod
    def _new_with_shape(self: _M, shape: Shape) -> _M:
        """A mesh of the same kind restricted/reshaped to ``shape`` (same base ranks)."""

    # -- slicing -------------------------------------------------------------

    def slice(self: _M, **kwargs: int | _pyslice) -> _M:
        """Select along named dimensions: an int removes the dimension, a ``slice`` keeps it."""
        shape = self._shape
        labels = shape.labels
        for label in kwargs:
            if label not in labels:
                raise TypeError(f"Shape does not have dimension labeled '{label}'")
        ndslice = shape.ndslice
        offset = ndslice.offset
        new_labels: list[str] = []
        new_sizes: list[int] = []
        new_strides: list[int] = []
        for label, size, stride in zip(labels, ndslice.sizes, ndslice.strides):
            if label not in kwargs:
                new_labels.append(label)
                new_sizes.append(size)
                new_strides.append(stride)
                continue
            sel = kwargs[label]
            if isinstance(sel, _pyslice):
                if sel.step is not None and operator.index(sel.step) <= 0:
                    raise ValueError(f"slice step must be positive, got {sel.step}")
                start, stop, step = sel.indices(size)
                offset += start * stride
                new_labels.append(label)
                new_sizes.append(len(range(start, stop, step)))
                new_strides.append(stride * step)
            else:
                try:
                    i = operator.index(sel)
                except TypeError:
                    raise TypeError(
                        f"slice index for '{label}' must be an int or a slice, got {type(sel).__name__}"
                    ) from None
                if not 0 <= i < size:
                    raise IndexError("index out of range")
                offset += i * stride
        return self._new_with_shape(
            Shape(new_labels, Slice(offset=offset, sizes=new_sizes, strides=new_strides))
        )

    # -- reshaping -------------------------------------------------------------

    def split(self: _M, **kwargs: Any) -> _M:
        """Split dimensions into several, row-major within the original dimension.

        ``mesh.split(host=('dp', 'pp'), gpu=('tp', 'cp'), pp=16, cp=2)``: keyword
        arguments whose value is a tuple/list (or a single str, i.e. a rename)
        name an existing dimension to split; int-valued ones constrain the size
        of a new dimension.  At most one size per split may be left unknown and
        is inferred.
        """
        shape = self._shape
        labels = shape.labels
        splits: dict[str, tuple[str, ...]] = {}
        constraints: dict[str, int] = {}
        for key, value in kwargs.items():
            if isinstance(value, str):
                splits[key] = (value,)
            elif isinstance(value, (tuple, list)):
                splits[key] = tuple(value)
            else:
                try:
                    constraints[key] = operator.index(value)
                except TypeError:
                    raise TypeError(
                        f"split argument '{key}' must be a tuple of names or an int size, "
                        f"got {type(value).__name__}"
                    ) from None
        for key in splits:
            if key not in labels:
                raise TypeError(f"Shape does not have dimension labeled '{key}'")

        ndslice = shape.ndslice
        new_labels: list[str] = []
        new_sizes: list[int] = []
        new_strides: list[int] = []
        used: set[str] = set()
        for label, size, stride in zip(labels, ndslice.sizes, ndslice.strides):
            if label not in splits:
                new_labels.append(label)
                new_sizes.append(size)
                new_strides.append(stride)
                continue
            names = splits[label]
            if not names:
                raise ValueError(f"dimension '{label}' must be split into at least one name")
            for n in names:
                if not isinstance(n, str):
                    raise TypeError(f"dimension names must be str, got {type(n).__name__}")
            sizes = self._split_sizes(label, size, names, constraints)
            used.update(n for n in names if n in constraints)
            # Row-major inside the original dimension: the last new name is innermost.
            sub_strides = [0] * len(names)
            acc = stride
            for k in range(len(names) - 1, -1, -1):
                sub_strides[k] = acc
                acc *= sizes[k]
            new_labels.extend(names)
            new_sizes.extend(sizes)
            new_strides.extend(sub_strides)

        seen: set[str] = set()
        for n in new_labels:
            if n in seen:
                raise ValueError(f"Duplicate dimension name '{n}'")
            seen.add(n)
        unused = [k for k in constraints if k not in used]
        if unused:
            raise ValueError(f"unused size constraints: {unused}")
        return self._new_with_shape(
            Shape(new_labels, Slice(offset=ndslice.offset, sizes=new_sizes, strides=new_strides))
        )

    @staticmethod
    def _split_sizes(label: str, size: int, names: Sequence[str], constraints: dict[str, int]) -> list[int]:
        """Sizes of the new dimensions, inferring at most one unknown."""
        unknown = [n for n in names if n not in constraints]
        for n in names:
            if n in constraints and constraints[n] < 0:
                raise ValueError(f"size of dimension '{n}' must be non-negative")
        if len(unknown) > 1:
            raise ValueError(
                f"Cannot infer size of dimensions {unknown} when splitting '{label}': "
                f"at most one size may be left unspecified"
            )
        known = 1
        for n in names:
            if n in constraints:
                known *= constraints[n]
        if not unknown:
            if known != size:
                raise ValueError(
                    f"dimension '{label}' of size {size} is not evenly divided into "
                    f"{[constraints[n] for n in names]}"
                )
            return [constraints[n] for n in names]
        if known == 0:
            raise ValueError(
                f"Cannot infer size of dimension '{unknown[0]}' when splitting '{label}': "
                f"the other sizes multiply to 0"
            )
        if size % known != 0:
            raise ValueError(f"dimension '{label}' of size {size} is not evenly divided by {known}")
        return [constraints[n] if n in constraints else size // known for n in names]

    def flatten(self: _M, name: str) -> _M:
        """Merge all dimensions into one named ``name``.

        Only possible when the ranks form a single strided run (e.g. a dense
        row-major mesh), otherwise ``ValueError("cannot flatten sparse mesh: ...")``.
        """
        ndslice = self._shape.ndslice
        expected: int | None = None  # stride the next-outer dim must have
        inner_stride = 1
        for size, stride in zip(reversed(ndslice.sizes), reversed(ndslice.strides)):
            if size == 1:
                continue
            if expected is None:
                inner_stride = stride
            elif stride != expected:
                raise ValueError(
                    f"cannot flatten sparse mesh: sizes={ndslice.sizes}, strides={ndslice.strides}"
                )
            expected = stride * size
        n = len(ndslice)
        if n == 0:
            inner_stride = 1
        return self._new_with_shape(
            Shape([name], Slice(offset=ndslice.offset, sizes=[n], strides=[inner_stride]))
        )

    def rename(self: _M, **kwargs: str) -> _M:
        """Rename dimensions (``old=new``); implemented as one-way splits."""
        for old, new in kwargs.items():
            if not isinstance(new, str):
                raise TypeError(f"new name for '{old}' must be a str, got {type(new).__name__}")
        return self.split(**{old: (new,) for old, new in kwargs.items()})

    # -- sizes -------------------------------------------------------------------

    def size(self, dim: None | str | Sequence[str] = None) -> int:
        """Number of ranks overall (``None``), along one label, or across several labels."""
        if dim is None:
            return len(self._shape)
        extent = self._shape.extent
        dims = [dim] if isinstance(dim, str) else list(dim)
        total = 1
        for d in dims:
            if d not in extent:
                raise KeyError(f"Shape does not have dimension labeled '{d}'")
            total *= extent[d]
        return total

    @property
    def sizes(self) -> dict[str, int]:
        """``{label: size}`` in dimension order."""
        shape = self._shape
        return dict(zip(shape.labels, shape.ndslice.sizes))

    @property
    def extent(self) -> Extent:
        """The mesh's dimensions and sizes."""
        return self._shape.extent

    def __len__(self) -> int:
        return len(self._shape)
