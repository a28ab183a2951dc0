"""Local memory an RDMA operation reads or writes: where it is and how long it is, found
without copying it (a torch tensor's storage, or the buffer behind a memoryview).

Only ``torch`` tensors need torch; a memoryview is read through the buffer protocol with
ctypes, so ``monarch.rdma`` works in processes that never import torch.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

UNSUPPORTED = "RDMABuffer only supports 1d contiguous torch.Tensor or 1d c-contiguous memoryview. Got: {}"


@dataclass(frozen=True)
class LocalMemory:
    """``size`` bytes at ``address`` in this process."""

    address: int
    size: int
    #: The same bytes as a flat memoryview that keeps the tensor or buffer alive: a slice of
    #: it queued on a socket stays valid whatever happens to the registration meanwhile.
    view: memoryview

    @property
    def readonly(self) -> bool:
        return self.view.readonly


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer``, to read a read-only buffer's address (ctypes' ``from_buffer``
    takes writable buffers only)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]


def _memoryview_address(mv: memoryview) -> int:
    view = _PyBuffer()
    _get_buffer(mv, ctypes.byref(view), 0)  # PyBUF_SIMPLE: contiguous is checked by the caller
    try:
        return int(view.buf or 0)
    finally:
        _release_buffer(ctypes.byref(view))


def _is_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(obj, torch.Tensor)


def local_memory(data: Any) -> LocalMemory:
    """The memory of ``data``; ValueError (Monarch's message) for anything else than a 1-D
    contiguous CPU tensor or a 1-D C-contiguous memoryview."""
    if isinstance(data, memoryview):
        if data.ndim != 1 or not data.c_contiguous:
            raise ValueError(
                UNSUPPORTED.format(f"memoryview with shape {data.shape}, strides {data.strides}")
            )
        flat = data if data.format == "B" else data.cast("B")
        return LocalMemory(_memoryview_address(data) if data.nbytes else 0, data.nbytes, flat)
    if _is_tensor(data):
        if data.dim() != 1 or not data.is_contiguous():
            raise ValueError(
                UNSUPPORTED.format(f"tensor with shape {tuple(data.shape)}, strides {data.stride()}")
            )
        if data.device.type != "cpu":
            raise ValueError(
                f"RDMABuffer over a {data.device.type} tensor is not supported by monarch-aio yet; "
                "only CPU memory can be registered.\nHINT: copy it to the CPU first (t.cpu())."
            )
        size = data.numel() * data.element_size()
        if size == 0:
            return LocalMemory(0, 0, memoryview(b""))
        array = (ctypes.c_char * size).from_address(data.data_ptr())
        array.tensor = data  # type: ignore[attr-defined]  # the view keeps the tensor alive
        return LocalMemory(data.data_ptr(), size, memoryview(array).cast("B"))
    raise ValueError(UNSUPPORTED.format(type(data).__name__))
