"""Local memory an RDMA operation reads or writes: where it is and how long it is, found
without copying it (a torch tensor's storage, or the buffer behind a memoryview).

Only ``torch`` tensors need torch; a memoryview is read through the buffer protocol with
ctypes, so ``monarch.rdma`` works in processes that never import torch.

Device memory (a CUDA tensor) cannot be reached by ``memmove`` or ``process_vm_readv``: its
bytes are staged through host memory by torch, a chunk at a time, by whichever side holds it
(the owner's runtime serves its chunks; a reader copies each arriving chunk to its device).
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
    #: it queued on a socket stays valid whatever happens to the registration meanwhile
    #: (empty for device memory, which no memoryview can reach).
    view: memoryview
    #: The flat ``uint8`` tensor of device memory; None for host memory.
    device_tensor: Any = None

    @property
    def readonly(self) -> bool:
        return self.device_tensor is None and self.view.readonly

    @property
    def device(self) -> str:
        """``"cpu"`` for host memory, else the tensor's device type (``"cuda"``)."""
        return "cpu" if self.device_tensor is None else str(self.device_tensor.device.type)

    def read(self, start: int, end: int) -> memoryview:
        """Bytes ``[start, end)`` in host memory (a copy, for device memory)."""
        if self.device_tensor is None:
            return self.view[start:end]
        return _host_view(self.device_tensor[start:end].cpu())

    def write(self, start: int, data: memoryview) -> None:
        """Store ``data`` at ``start``; for device memory, done once the device has it."""
        if self.device_tensor is None:
            self.view[start : start + data.nbytes] = data
            return
        import torch

        staging = torch.empty(data.nbytes, dtype=torch.uint8)
        _host_view(staging)[:] = data
        target = self.device_tensor[start : start + data.nbytes]
        target.copy_(staging)
        torch.accelerator.synchronize(target.device)


def copy(dst: LocalMemory, src: LocalMemory, n: int) -> None:
    """Copy the leading ``n`` bytes of ``src`` to ``dst``, both in this process."""
    if dst.device_tensor is None and src.device_tensor is None:
        ctypes.memmove(dst.address, src.address, n)
    elif dst.device_tensor is not None and src.device_tensor is not None:
        import torch

        dst.device_tensor[:n].copy_(src.device_tensor[:n])
        torch.accelerator.synchronize(dst.device_tensor.device)
    elif n:
        dst.write(0, src.read(0, n))


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


def _host_view(tensor: Any) -> memoryview:
    """A flat memoryview of a contiguous CPU tensor's bytes that keeps the tensor alive."""
    size = tensor.numel() * tensor.element_size()
    array = (ctypes.c_char * size).from_address(tensor.data_ptr())
    array.tensor = tensor  # type: ignore[attr-defined]
    return memoryview(array).cast("B")


def _is_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(obj, torch.Tensor)


def local_memory(data: Any) -> LocalMemory:
    """The memory of ``data``; ValueError (Monarch's message) for anything else than a 1-D
    contiguous tensor (CPU or device memory) or a 1-D C-contiguous memoryview."""
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
        size = data.numel() * data.element_size()
        if size == 0:
            return LocalMemory(0, 0, memoryview(b""))
        if data.device.type != "cpu":
            flat = data.view(sys.modules["torch"].uint8)  # 1-D: its bytes, in order
            return LocalMemory(data.data_ptr(), size, memoryview(b""), flat)
        return LocalMemory(data.data_ptr(), size, _host_view(data))
    raise ValueError(UNSUPPORTED.format(type(data).__name__))
