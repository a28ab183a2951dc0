"""``RDMABuffer`` and ``RDMAAction``: Monarch's one-sided bulk transfer API.

A buffer is a small handle (the owner's address, a registration id, a size) that travels in
messages; bytes move only when someone calls ``read_into`` or ``write_from``, and the owning
actor takes no part in it (see ``transfer`` for how they move, ``registry`` for the owner's
side).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

from monarch._src.actor.context import context
from monarch._src.actor.future import (
    Future,
    pending_future,
    set_exception,
    set_result,
)
from monarch._src.actor.port import PortHandler
from monarch._src.actor.process_state import runtime
from monarch._src.rdma import vm_copy
from monarch._src.rdma.memory import local_memory
from monarch._src.rdma.registry import local_registry
from monarch._src.rdma.transfer import Operation, RemoteBuffer, submit
from monarch._src.runtime.config import CONFIG
from monarch._src.wire.protocol import RDMA_DROP, rdma

#: The values of the ``rdma_backend`` setting.
BACKEND_SETTINGS = ("auto", "tcp", "none")


@functools.cache
def is_ibverbs_available() -> bool:
    """Whether this machine has an ibverbs device that pyverbs can open (probed once)."""
    try:
        from pyverbs.device import get_device_list  # optional: the "rdma" extra
    except ImportError:
        return False
    try:
        return bool(get_device_list())
    except Exception:  # pyverbs raises PyverbsRDMAError when there is no device at all
        return False


def is_rdma_available() -> bool:
    """Deprecated in Monarch: whether ibverbs is available. Use ``get_rdma_backend()``."""
    warnings.warn(
        "is_rdma_available is deprecated because Monarch now supports multiple RDMA backends, "
        "making this function ambiguous. For now it indicates whether RDMA over ibverbs is "
        "available. Use is_ibverbs_available() or get_rdma_backend() instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()


def get_rdma_backend() -> str:
    """``"tcp"``: bytes move by one-sided memory copies within a host and by chunks served by
    the owner's runtime between hosts; ``"none"``: RDMA is turned off by the settings.
    (monarch-aio has no ibverbs backend yet, so ``"ibverbs"`` is never returned.)"""
    setting = CONFIG.rdma_backend
    if setting not in BACKEND_SETTINGS:
        hint = (
            "monarch-aio has no ibverbs backend yet; 'auto' copies memory directly within a "
            "host and serves chunks between hosts."
            if setting == "ibverbs"
            else f"the values are: {', '.join(BACKEND_SETTINGS)}"
        )
        raise ValueError(
            f"unknown RDMA backend {setting!r} (setting rdma_backend, MONARCH_RDMA_BACKEND)\nHINT: {hint}"
        )
    if setting == "none" or (setting == "auto" and not CONFIG.rdma_allow_tcp_fallback):
        return "none"
    return "tcp"


def _check_timeout(timeout: float) -> float:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or timeout < 0
        or math.isnan(timeout)
    ):
        raise ValueError(f"invalid RDMA timeout {timeout!r}: expected a number of seconds >= 0")
    return float(timeout)


class RDMABuffer:
    """A registered 1-D contiguous tensor (CPU or CUDA) or C-contiguous memoryview, shared
    without a copy: pass it in messages; any actor holding it reads or writes the bytes
    one-sidedly."""

    __slots__ = ("_remote",)

    def __init__(self, data: Any) -> None:
        if get_rdma_backend() == "none":
            raise RuntimeError(
                "Tried to create an RDMABuffer, but RDMA is not available on this platform. To "
                "enable TCP fallback transport, call monarch.configure(rdma_allow_tcp_fallback=True) "
                "before creating buffers."
            )
        memory = local_memory(data)
        if memory.size == 0:
            raise ValueError("Cannot create RDMABuffer with size 0.")
        owner = str(context().actor_instance.actor_id)
        buffer_id = local_registry().register(memory)
        self._remote = RemoteBuffer(
            runtime().address,
            vm_copy.host_identity(),
            buffer_id,
            memory.size,
            owner,
            memory.readonly,
            memory.device,
        )

    @property
    def backend(self) -> str:
        """The backend in use (``get_rdma_backend()``)."""
        return get_rdma_backend()

    @property
    def owner(self) -> str:
        """The id of the actor that registered the buffer."""
        return self._remote.owner

    def size(self) -> int:
        """Bytes in the buffer."""
        return self._remote.size

    def read_into(self, dst: Any, *, timeout: float = 60) -> Future[None]:
        """Copy the buffer into the leading bytes of ``dst`` (at least ``size()`` bytes)."""
        return RDMAAction().read_remote(dst, self).submit(timeout=timeout)

    def write_from(self, src: Any, *, timeout: float = 60) -> Future[None]:
        """Copy ``src`` (at most ``size()`` bytes) into the leading bytes of the buffer."""
        return RDMAAction().write_remote(self, src).submit(timeout=timeout)

    def drop(self) -> Future[None]:
        """Release the registration, once transfers in progress are over; later reads and
        writes fail. Dropping twice is harmless."""
        remote = self._remote
        rt = runtime()
        if remote.address == rt.address:
            done: Future[None] = pending_future()
            local_registry().drop(remote.buffer_id, lambda: set_result(done, None))
            return done
        return _DropRequest(remote).done

    def __reduce__(self) -> Any:
        return (_rebuild, (self._remote,))

    def __repr__(self) -> str:
        return (
            f"RDMABuffer(size={self._remote.size}, owner={self._remote.owner!r}, id={self._remote.buffer_id})"
        )


def _rebuild(remote: RemoteBuffer) -> RDMABuffer:
    buf = object.__new__(RDMABuffer)
    buf._remote = remote
    return buf


class _DropRequest(PortHandler):
    """A drop asked of the owner's runtime; fails if the owner's process is dead."""

    def __init__(self, remote: RemoteBuffer) -> None:
        self.done: Future[None] = pending_future()
        self._remote = remote
        self.label = f"RDMABuffer.drop of buffer {remote.buffer_id}"
        self.open()
        self.expect_from([remote.address])
        runtime().send(
            remote.address, rdma(RDMA_DROP, remote.buffer_id, [runtime().address, self.port_id]), [b""]
        )

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        self.close()
        self.stop_expecting()
        if is_exception:
            set_exception(self.done, value)  # a drop is never refused: this is a broken reply
        else:
            set_result(self.done, None)

    def fail(self, exc: BaseException) -> None:
        self.close()
        set_exception(
            self.done,
            RuntimeError(f"Failed to drop buffer: the owner's process ({self._remote.address}) died.\n{exc}"),
        )


class RDMAAction:
    """A batch of reads and writes submitted as one unit: ``submit()`` resolves once every
    operation is done, or fails with the first error. Repeatable; empty is a no-op."""

    def __init__(self) -> None:
        self._ops: list[Operation] = []

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Queue a read of ``src`` into the leading bytes of local ``dst``."""
        local = local_memory(dst)
        if local.readonly:
            raise ValueError("the destination of an RDMA read is read-only memory")
        if local.size < src.size():
            raise ValueError(
                f"destination local memory size ({local.size}) must be >= remote buffer size ({src.size()})"
            )
        self._ops.append(Operation(False, src._remote, local))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Queue a write of local ``src`` into the leading bytes of ``dst``."""
        local = local_memory(src)
        if local.size > dst.size():
            raise ValueError(
                f"source local memory size ({local.size}) must be <= remote buffer size ({dst.size()})"
            )
        if dst._remote.readonly:
            raise ValueError(f"{dst!r} was registered over read-only memory: it can be read, not written")
        self._ops.append(Operation(True, dst._remote, local))
        return self

    def fetch_add(self, src: RDMABuffer, dst: Any, add: int) -> RDMAAction:
        """Atomic fetch-and-add: not supported (as in Monarch)."""
        raise NotImplementedError("Not yet supported")

    def compare_and_swap(self, src: RDMABuffer, dst: Any, compare: int, swap: int) -> RDMAAction:
        """Atomic compare-and-swap: not supported (as in Monarch)."""
        raise NotImplementedError("Not yet supported")

    def submit(self, *, timeout: float = 60) -> Future[None]:
        """Start every queued operation; see the class docstring."""
        return submit(list(self._ops), _check_timeout(timeout))
