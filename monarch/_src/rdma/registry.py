"""The buffers this process registered, served by its runtime (never by the owning actor).

A registration keeps the buffer's memory alive until ``drop``. Other processes reach it
through RDMA frames handled on this process's event loop thread: a pin while they copy the
memory themselves (one host), or chunks read and written here (other hosts). A pin delays a
drop until the copy is over (or the pin's time is up, or its holder's process died), so a
dropped buffer's memory is never read or written: a request after the drop gets Monarch's
error.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monarch._src.actor.process_state import runtime
from monarch._src.rdma.memory import LocalMemory
from monarch._src.wire import payload
from monarch._src.wire.protocol import (
    FLAG_EXCEPTION,
    RDMA_BUFFER,
    RDMA_DROP,
    RDMA_KIND,
    RDMA_LENGTH,
    RDMA_OFFSET,
    RDMA_OP,
    RDMA_PIN,
    RDMA_READ,
    RDMA_RELEASE,
    RDMA_TIMEOUT,
    RDMA_WRITE,
    REPLY_PORT,
    port_value,
)

if TYPE_CHECKING:
    from monarch._src.runtime.runtime import Runtime

logger = logging.getLogger("monarch.rdma")

#: Called once a drop is done.
DropDone = Callable[[], object]


class BufferDropped(RuntimeError):
    """What the owner's runtime answers for a dropped buffer; the asker, who knows the owning
    actor's name, raises ``dropped_error`` instead."""


def dropped_error(buffer_id: int, owner: str) -> RuntimeError:
    return RuntimeError(
        f"RDMABuffer {buffer_id} of {owner} has been dropped: its memory can no longer be read "
        "or written.\nHINT: ask its owner for a new RDMABuffer; drop() a buffer only once no "
        "one will use it again."
    )


@dataclass
class _Registration:
    memory: LocalMemory
    #: pin id -> (holder's address, deadline on time.monotonic()).
    pins: dict[int, tuple[str, float]] = field(default_factory=dict)
    #: Set by drop: new requests fail; told once the last pin goes.
    drop_waiters: list[DropDone] | None = None


class Registry:
    """This process's registered buffers; its one instance is ``local_registry()``."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._lock = threading.Lock()
        self._buffers: dict[int, _Registration] = {}
        self._ids = itertools.count(1)
        #: pin id -> buffer id.
        self._pins: dict[int, int] = {}
        rt.register(RDMA_KIND, self.handle)
        rt.on_peer_lost(lambda address, reason: self._release_pins(lambda holder, _: holder == address))

    # -- this process ---------------------------------------------------------------------------

    def register(self, memory: LocalMemory) -> int:
        with self._lock:
            buffer_id = next(self._ids)
            self._buffers[buffer_id] = _Registration(memory)
        return buffer_id

    def memory_of(self, buffer_id: int, owner: str) -> LocalMemory:
        """The registered memory; ``dropped_error`` once ``drop`` was called."""
        reg = self._buffers.get(buffer_id)
        if reg is None or reg.drop_waiters is not None:
            raise dropped_error(buffer_id, owner)
        return reg.memory

    def drop(self, buffer_id: int, done: DropDone) -> None:
        """Unregister the buffer once no pin holds it, then call ``done`` (at once if it was
        dropped already: dropping twice is harmless)."""
        with self._lock:
            reg = self._buffers.get(buffer_id)
            if reg is not None:
                if reg.drop_waiters is None:
                    reg.drop_waiters = []
                reg.drop_waiters.append(done)
        if reg is None:
            done()
        elif reg.pins:
            # A pin whose holder went silent must not hold the drop past its deadline.
            delay = max(0.0, max(d for _, d in reg.pins.values()) - time.monotonic())
            self._rt.loop.call_soon_threadsafe(self._rt.loop.call_later, delay + 0.01, self._expire_pins)
        else:
            self._finish_drop(buffer_id)

    def _finish_drop(self, buffer_id: int) -> None:
        with self._lock:
            reg = self._buffers.get(buffer_id)
            if reg is None or reg.pins or reg.drop_waiters is None:
                return
            del self._buffers[buffer_id]
        for done in reg.drop_waiters:
            done()

    def pin(self, buffer_id: int, holder: str, timeout: float) -> tuple[int, LocalMemory]:
        with self._lock:
            reg = self._buffers.get(buffer_id)
            if reg is None or reg.drop_waiters is not None:
                raise BufferDropped(buffer_id)
            if reg.memory.device_tensor is not None:
                raise ValueError(f"buffer {buffer_id} is {reg.memory.device} memory: read it in chunks")
            pin_id = next(self._ids)
            reg.pins[pin_id] = (holder, time.monotonic() + timeout)
            self._pins[pin_id] = buffer_id
        return pin_id, reg.memory

    def release(self, pin_id: int) -> None:
        with self._lock:
            buffer_id = self._pins.pop(pin_id, None)
            reg = self._buffers.get(buffer_id) if buffer_id is not None else None
            if reg is None:
                return
            reg.pins.pop(pin_id, None)
            last = not reg.pins and reg.drop_waiters is not None
        if last:
            self._finish_drop(buffer_id)  # type: ignore[arg-type]

    def _release_pins(self, which: Callable[[str, float], bool]) -> None:
        with self._lock:
            gone = [
                pin_id for reg in self._buffers.values() for pin_id, (h, d) in reg.pins.items() if which(h, d)
            ]
        for pin_id in gone:
            self.release(pin_id)

    def _expire_pins(self) -> None:
        now = time.monotonic()
        self._release_pins(lambda holder, deadline: deadline <= now)

    # -- requests from other processes (on the loop thread) -------------------------------------

    def handle(self, header: dict, bodies: list) -> None:
        op = header[RDMA_OP]
        buffer_id = header[RDMA_BUFFER]
        if op == RDMA_RELEASE:
            self.release(header[RDMA_OFFSET])
            return
        reply: list = header[REPLY_PORT]
        try:
            if op == RDMA_DROP:
                self.drop(buffer_id, lambda: self._reply(reply, None))
                return
            if op == RDMA_PIN:
                pin_id, memory = self.pin(buffer_id, reply[0], header[RDMA_TIMEOUT])
                self._reply(reply, (pin_id, os.getpid(), memory.address))
                return
            reg = self._buffers.get(buffer_id)
            if reg is None or reg.drop_waiters is not None:
                raise BufferDropped(buffer_id)
            memory = reg.memory
            offset = header[RDMA_OFFSET]
            if op == RDMA_READ:
                end = offset + header[RDMA_LENGTH]
                _check_range(offset, end, memory.size)
                self._reply(reply, offset, memory.read(offset, end))
            elif op == RDMA_WRITE:
                data = memoryview(bodies[1]).cast("B")
                _check_range(offset, offset + data.nbytes, memory.size)
                memory.write(offset, data)
                self._reply(reply, offset)
            else:
                raise ValueError(f"unknown RDMA operation {op!r}")
        except Exception as e:
            self._reply(reply, e, exception=True)

    def _reply(
        self, reply: list, value: Any, chunk: memoryview | None = None, *, exception: bool = False
    ) -> None:
        bodies = payload.dumps(value)
        if chunk is not None:
            bodies = [*bodies, chunk]
        try:
            self._rt.send(reply[0], port_value(reply[1], None, FLAG_EXCEPTION if exception else 0), bodies)
        except Exception:
            logger.warning("could not answer an RDMA request from %s", reply[0], exc_info=True)


def _check_range(start: int, end: int, size: int) -> None:
    if start < 0 or end > size:
        raise ValueError(f"bytes [{start}, {end}) are outside the buffer's {size} bytes")


_registry: Registry | None = None
_registry_lock = threading.Lock()


def local_registry() -> Registry:
    """This process's registry, made (and its frame handler installed) on first use."""
    global _registry
    rt = runtime()
    with _registry_lock:
        if _registry is None or _registry._rt is not rt:
            _registry = Registry(rt)
        return _registry
