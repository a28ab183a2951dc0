"""Moving bytes between local memory and a registered buffer, the reader's (or writer's) side.

Three ways, chosen per operation, with one meaning:

- the owner is this process: a ``memmove``;
- the owner is on this host: pin the buffer with one request to the owner's runtime, copy
  with ``process_vm_readv``/``process_vm_writev`` on a thread of this process, release the
  pin (``vm_copy``); where the kernel forbids that, the next way;
- otherwise: chunks read or written by the owner's runtime (``registry``), four in flight,
  over the transport (which uses ``/dev/shm`` for large bodies between processes of one host).

Every operation ends: with its result, with the owner's error (a dropped buffer), with an
error once the owner's process is found dead, or with ``TimeoutError`` at the deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monarch._src.actor.future import (
    Future,
    add_done_callback,
    pending_future,
    set_exception,
    set_result,
    when_all_succeeded,
)
from monarch._src.actor.port import PortHandler
from monarch._src.actor.process_state import runtime
from monarch._src.rdma import vm_copy
from monarch._src.rdma.memory import LocalMemory, copy
from monarch._src.rdma.notices import notice_served_transfer
from monarch._src.rdma.registry import BufferDropped, dropped_error, local_registry
from monarch._src.runtime.config import CONFIG
from monarch._src.wire import payload
from monarch._src.wire.protocol import (
    FLAG_EXCEPTION,
    FLAGS,
    RDMA_PIN,
    RDMA_READ,
    RDMA_RELEASE,
    RDMA_WRITE,
    rdma,
)

#: Chunk requests in flight per served transfer.
WINDOW = 4

#: Hosts (``vm_copy.host_identity``) where the kernel refused a copy (EPERM): served from then on.
_vm_forbidden: set[str] = set()


@dataclass(frozen=True)
class RemoteBuffer:
    """What an ``RDMABuffer`` handle carries: who owns the bytes, never the bytes."""

    #: The owner's process (its runtime's address).
    address: str
    #: ``vm_copy.host_identity()`` of the owner's process.
    host: str
    buffer_id: int
    size: int
    #: The owning actor's id, for messages.
    owner: str
    readonly: bool
    #: ``"cpu"``, or the device type of the owner's tensor (reached by served chunks only).
    device: str = "cpu"


@dataclass(frozen=True)
class Operation:
    """Read ``remote`` into ``local`` (``write`` False) or write ``local`` into ``remote``;
    only the leading ``min`` of both sizes moves: ``RDMAAction`` checked which one."""

    write: bool
    remote: RemoteBuffer
    local: LocalMemory

    @property
    def size(self) -> int:
        return min(self.remote.size, self.local.size)

    def describe(self) -> str:
        what = "write into" if self.write else "read from"
        return f"RDMA {what} buffer {self.remote.buffer_id} of {self.remote.owner}"


def submit(ops: list[Operation], timeout: float) -> Future[None]:
    """Run ``ops`` concurrently; the Future resolves once all succeeded, or fails with the
    first error (or ``TimeoutError`` after ``timeout`` seconds)."""
    futures = [_start(op, timeout) for op in ops]
    result = when_all_succeeded(futures, None)
    if not result.done():
        _fail_at_deadline(futures, ops, timeout)
    return result


def _fail_at_deadline(futures: list[Future[None]], ops: list[Operation], timeout: float) -> None:
    # The timer keeps only the futures (not the memory of the operations) until it fires.
    descriptions = [op.describe() for op in ops]

    def expire() -> None:
        for f, what in zip(futures, descriptions):
            set_exception(f, TimeoutError(f"{what} did not finish within its timeout of {timeout} s"))

    rt = runtime()
    rt.loop.call_soon_threadsafe(rt.loop.call_later, timeout, expire)


def _start(op: Operation, timeout: float) -> Future[None]:
    done: Future[None] = pending_future()
    try:
        rt = runtime()
        if op.remote.address == rt.address:
            memory = local_registry().memory_of(op.remote.buffer_id, op.remote.owner)
            dst, src = (memory, op.local) if op.write else (op.local, memory)
            copy(dst, src, op.size)
            set_result(done, None)
        elif (
            CONFIG.rdma_backend == "auto"
            and op.remote.host == vm_copy.host_identity()
            and op.remote.host not in _vm_forbidden
            and op.remote.device == op.local.device == "cpu"
        ):
            _VmTransfer(op, done).start(timeout)
        else:
            if CONFIG.rdma_backend == "tcp":
                why = "forced by MONARCH_RDMA_BACKEND=tcp"
            elif op.remote.host != vm_copy.host_identity():
                why = "the owner is on another host"
            else:
                why = f"{op.remote.device if op.remote.device != 'cpu' else op.local.device} memory is staged through host memory"
            notice_served_transfer(why)
            _ServedTransfer(op, done).start()
    except Exception as e:
        set_exception(done, e)
    return done


class _Replies(PortHandler):
    """Where the owner's runtime answers one transfer's requests; fails the transfer if the
    owner's process dies first."""

    raw_frames = True

    def __init__(self, op: Operation, done: Future[None], on_reply: Callable[[Any, Any], None]) -> None:
        self._op = op
        self._done = done
        self._on_reply = on_reply
        self.label = op.describe()
        self.open()
        add_done_callback(done, lambda _: self.finish())
        self.expect_from([op.remote.address])

    def deliver_frame(self, header: dict, bodies: list) -> None:
        if self._done.done():
            return
        try:
            if header.get(FLAGS, 0) & FLAG_EXCEPTION:
                exc = payload.loads(bodies)
                if isinstance(exc, BufferDropped):
                    exc = dropped_error(self._op.remote.buffer_id, self._op.remote.owner)
                set_exception(self._done, exc)
                return
            self._on_reply(payload.loads(bodies[:1]), bodies[1] if len(bodies) > 1 else None)
        except Exception as e:
            set_exception(self._done, e)

    def fail(self, exc: BaseException) -> None:
        error = RuntimeError(
            f"{self._op.describe()} failed: the owner's process ({self._op.remote.address}) died.\n{exc}"
        )
        set_exception(self._done, error)

    def finish(self) -> None:
        self.close()
        self.stop_expecting()

    def reply_to(self) -> list:
        return [runtime().address, self.port_id]


class _VmTransfer:
    """Pin, copy on a thread of this process, release."""

    def __init__(self, op: Operation, done: Future[None]) -> None:
        self._op = op
        self._done = done
        self._replies = _Replies(op, done, self._pinned)

    def start(self, timeout: float) -> None:
        # The pin lasts as long as the transfer may: a drop waits for it no longer than that.
        header = rdma(RDMA_PIN, self._op.remote.buffer_id, self._replies.reply_to(), timeout=timeout)
        runtime().send(self._op.remote.address, header, [b""])

    def _pinned(self, value: tuple[int, int, int], _: Any) -> None:
        threading.Thread(target=self._copy, args=value, name="monarch-rdma-copy", daemon=True).start()

    def _copy(self, pin_id: int, pid: int, address: int) -> None:
        op = self._op
        try:
            vm_copy.copy(
                pid,
                op.local.address,
                address,
                op.size,
                write=op.write,
                piece=max(4096, CONFIG.rdma_chunk_bytes),
                keep_going=lambda: not self._done.done(),
            )
        except vm_copy.VmCopyForbidden as e:
            self._release(pin_id)
            _vm_forbidden.add(op.remote.host)
            notice_served_transfer(f"the kernel forbids copying another process's memory here: {e}")
            self._replies.finish()
            _ServedTransfer(op, self._done).start()
            return
        except vm_copy.OwnerGone as e:
            error = RuntimeError(f"{op.describe()} failed: the owner's process (pid {pid}) is gone ({e}).")
            set_exception(self._done, error)
        except Exception as e:
            self._release(pin_id)
            set_exception(self._done, e)
        else:
            self._release(pin_id)
            set_result(self._done, None)

    def _release(self, pin_id: int) -> None:
        try:
            runtime().send(
                self._op.remote.address,
                rdma(RDMA_RELEASE, self._op.remote.buffer_id, None, offset=pin_id),
                [b""],
            )
        except Exception:
            pass  # the owner is gone, and its pins with it


class _ServedTransfer:
    """Chunks read or written by the owner's runtime, ``WINDOW`` in flight."""

    def __init__(self, op: Operation, done: Future[None]) -> None:
        self._op = op
        self._done = done
        self._chunk = max(4096, CONFIG.rdma_chunk_bytes)
        self._next = 0  # offset of the next chunk to ask for
        self._acked = 0  # bytes done
        self._lock = threading.Lock()
        self._replies = _Replies(op, done, self._on_reply)

    def start(self) -> None:
        if self._op.size == 0:
            set_result(self._done, None)
            return
        for _ in range(WINDOW):
            self._ask()

    def _ask(self) -> None:
        with self._lock:
            offset = self._next
            if offset >= self._op.size:
                return
            n = min(self._chunk, self._op.size - offset)
            self._next = offset + n
        op = self._op
        reply = self._replies.reply_to()
        if op.write:
            header = rdma(RDMA_WRITE, op.remote.buffer_id, reply, offset=offset)
            runtime().send(op.remote.address, header, [b"", op.local.read(offset, offset + n)])
        else:
            header = rdma(RDMA_READ, op.remote.buffer_id, reply, offset=offset, length=n)
            runtime().send(op.remote.address, header, [b""])

    def _on_reply(self, offset: int, chunk: Any) -> None:
        op = self._op
        if not op.write:
            data = memoryview(chunk).cast("B")
            op.local.write(offset, data)
            n = data.nbytes
        else:
            n = min(self._chunk, op.size - offset)
        with self._lock:
            self._acked += n
            finished = self._acked >= op.size
        if finished:
            set_result(self._done, None)
        else:
            self._ask()
