"""Payload codec: cloudpickle protocol 5 with large buffers carried out of band.

``dumps`` returns ``[pickle_stream, buffer, buffer, ...]``; the buffers are views of the
original objects' memory, never copies. Plain ``bytes`` and CPU torch tensors do not offer
out-of-band buffers by themselves, so the pickler reduces large ones to a ``PickleBuffer``.
Classes and functions defined in ``__main__`` or a notebook pickle by value (cloudpickle),
their code with its real file name (and a notebook cell's source), so that tracebacks raised
in other processes name the file or cell and show the line.
"""

from __future__ import annotations

import io
import marshal
import pickle
import sys
from collections.abc import Sequence
from types import CodeType
from typing import Any

#: Buffers smaller than this stay inside the pickle stream: a separate write costs more.
OUT_OF_BAND_THRESHOLD = 64 * 1024


def _bytes_from_buffer(buf: Any) -> bytes:
    return buf if type(buf) is bytes else bytes(buf)  # already bytes: read so by the transport


def _tensor_from_buffer(buf: Any, dtype: Any, shape: tuple[int, ...], requires_grad: bool) -> Any:
    import torch

    t = torch.frombuffer(buf, dtype=dtype) if len(memoryview(buf)) else torch.empty(0, dtype=dtype)
    t = t.reshape(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce_torch_tensor(obj: Any) -> Any:
    """Reduce a large dense contiguous CPU tensor to a raw buffer; else defer to torch."""
    torch = sys.modules["torch"]
    if (
        type(obj) is not torch.Tensor
        or obj.device.type != "cpu"
        or obj.layout != torch.strided
        or not obj.is_contiguous()
        or obj.is_quantized
        or obj.grad_fn is not None
        or obj.nbytes < OUT_OF_BAND_THRESHOLD
    ):
        return NotImplemented
    flat = obj.detach().reshape(-1).view(torch.uint8)
    return (
        _tensor_from_buffer,
        (pickle.PickleBuffer(flat.numpy()), obj.dtype, tuple(obj.shape), obj.requires_grad),
    )


class _LargeBytes:
    """Stands in for a large ``bytes`` while pickling: the C pickler writes exact ``bytes``
    in band without asking any hook, so large ones are wrapped to travel out of band."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _bytes_from_buffer, (pickle.PickleBuffer(self.data),)


def _lift_large_bytes(obj: Any, depth: int = 0) -> Any:
    """``obj`` with large bytes (in small containers, a few levels deep) wrapped."""
    t = type(obj)
    if t is bytes:
        return _LargeBytes(obj) if len(obj) >= OUT_OF_BAND_THRESHOLD else obj
    if depth >= 3 or (t is not tuple and t is not list and t is not dict) or len(obj) > 64:
        return obj
    if t is dict:
        items = {k: _lift_large_bytes(v, depth + 1) for k, v in obj.items()}
        return items if any(items[k] is not v for k, v in obj.items()) else obj
    lifted = [_lift_large_bytes(x, depth + 1) for x in obj]
    if all(a is b for a, b in zip(lifted, obj)):
        return obj
    return tuple(lifted) if t is tuple else lifted


def _reduce_code(code: CodeType) -> Any:
    """Ship a code object whole, ``co_filename`` included (cloudpickle would replace it with
    ``<dynamic-code>``), plus the source of a notebook cell or other code that exists only in
    this process's ``linecache`` (an entry without a modification time), so that a traceback
    formatted where it runs can show its lines. Source files are read there from disk."""
    filename = code.co_filename
    linecache = sys.modules.get("linecache")  # nothing is registered before it is imported
    entry = linecache.cache.get(filename) if linecache is not None else None
    lines = entry[2] if entry is not None and len(entry) == 4 and entry[1] is None else None
    return _load_code, (marshal.dumps(code), filename, lines)


def _load_code(data: bytes, filename: str, lines: list[str] | None) -> CodeType:
    if lines:
        import linecache

        if filename not in linecache.cache:
            linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    return marshal.loads(data)


_pickler_class: Any = None


def _pickler() -> Any:
    """cloudpickle's Pickler with our out-of-band rules (cloudpickle is imported on first use)."""
    global _pickler_class
    if _pickler_class is None:
        import cloudpickle

        class _Pickler(cloudpickle.Pickler):
            def reducer_override(self, obj: Any) -> Any:
                if type(obj) is CodeType:
                    return _reduce_code(obj)
                if type(obj).__name__ == "Tensor" and "torch" in sys.modules:
                    return _reduce_torch_tensor(obj)
                return super().reducer_override(obj)

        _pickler_class = _Pickler
    return _pickler_class


_SCALARS = frozenset({int, float, str, bool, type(None), complex})


def _is_plain(obj: Any, depth: int = 0) -> bool:
    """Whether the C pickler alone gives the same result as cloudpickle (small builtins only)."""
    t = type(obj)
    if t in _SCALARS:
        return True
    if t is bytes:
        return len(obj) < OUT_OF_BAND_THRESHOLD
    if depth > 2:
        return False
    if t is tuple or t is list:
        return len(obj) <= 16 and all(_is_plain(x, depth + 1) for x in obj)
    if t is dict:
        return len(obj) <= 16 and all(type(k) is str and _is_plain(v, depth + 1) for k, v in obj.items())
    return False


#: Types whose values cannot change once made (``bytes`` included, whatever its size).
_IMMUTABLE = _SCALARS | {bytes}


def needs_no_copy(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` is made only of immutable builtins (scalars, ``str``, ``bytes``, and
    small tuples of those), so that a message inside this process may carry it as it is: a
    pickled copy could not be told apart from it, and neither side can change it under the other."""
    t = type(obj)
    if t in _IMMUTABLE:
        return True
    return (
        t is tuple
        and depth < 3
        and len(obj) <= 16
        and all(type(x) in _IMMUTABLE or needs_no_copy(x, depth + 1) for x in obj)
    )


def call_needs_no_copy(args: tuple, kwargs: dict) -> bool:
    """``needs_no_copy`` for a call's arguments (the keyword dict itself is the callee's own)."""
    for a in args:
        if type(a) not in _IMMUTABLE and not needs_no_copy(a):
            return False
    return not kwargs or all(needs_no_copy(v) for v in kwargs.values())


def dumps_plain_call(args: tuple, kwargs: dict) -> list[Any] | None:
    """``dumps((args, kwargs))`` of the common call with a few scalar arguments, by the C
    pickler alone (the same bytes as cloudpickle's); None for any other call."""
    if not kwargs and len(args) <= 8:
        for a in args:
            if type(a) not in _SCALARS:
                return None
        return [pickle.dumps((args, kwargs), 5)]
    return None


def dumps(obj: Any) -> list[Any]:
    """Serialize ``obj`` into ``[stream, *out_of_band_buffers]`` without copying large buffers."""
    if type(obj) in _SCALARS or _is_plain(obj):  # the common small message: skip cloudpickle's setup
        return [pickle.dumps(obj, 5)]
    buffers: list[Any] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < OUT_OF_BAND_THRESHOLD:
            return True  # in band
        buffers.append(raw)
        return False

    f = io.BytesIO()
    _pickler()(f, protocol=5, buffer_callback=keep).dump(_lift_large_bytes(obj))
    return [f.getbuffer(), *buffers]


def dumps_inband(obj: Any) -> bytes:
    """Serialize for delivery inside this process: one copy, shares no memory with ``obj``."""
    f = io.BytesIO()
    _pickler()(f, protocol=5).dump(obj)
    return f.getvalue()


def loads(bodies: Sequence[Any]) -> Any:
    """Inverse of ``dumps`` (or of ``dumps_inband`` when given a single bytes object).

    ``bytes`` is itself a ``Sequence``, so the annotation covers both forms; spelling out
    ``| bytes`` would stop mypy from narrowing the list form after the check below.
    """
    if bodies.__class__ is list:  # a message's bodies (checked first: one call less)
        return pickle.loads(bodies[0], buffers=bodies[1:]) if len(bodies) > 1 else pickle.loads(bodies[0])
    if isinstance(bodies, (bytes, bytearray, memoryview)):
        return pickle.loads(bodies)
    return pickle.loads(bodies[0], buffers=bodies[1:])
