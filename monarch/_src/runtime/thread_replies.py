"""Replies read by the thread that waits for them in ``Future.get()``, not handed over by the
runtime's loop.

A blocking call (``call_one(...).get()`` on the main thread, or in a sync actor's endpoint) used
to get its reply in two steps: the runtime's loop thread read it and resolved the future, which
woke the waiting thread (a second wake-up, tens of microseconds on a VM, on every reply). Here a
call made on a thread with no running event loop names a reply address lent to that thread
(a ``loop_replies.ReplyAddress``: its connections are accepted and authenticated on the
runtime's loop, as every connection is); while the thread waits in ``get()``, it reads that
address's connections itself, so a reply wakes it directly, as in a bare socket program.

Each of those connections is in two epoll sets: the runtime loop's (a ``ReaderSet``, which that
loop watches as one descriptor) and the holder's own (with the holder's wake-up descriptor). While the holder
waits, its connections are switched off in the runtime loop's set (an ``epoll_ctl`` from the
holder's own thread: no hop to the loop), so only the holder wakes for them; at any other time
the runtime's loop reads them, so no reply waits on a thread busy elsewhere. Whoever reads does
so under the connection's lock, so nothing is read twice or out of order. A future the holder
waits for that another thread resolves (its reply came elsewhere, or a failure) wakes it
through its wake-up descriptor. A thread that ends gives its address back to a pool for the
next one (replies still on their way are read by the runtime's loop meanwhile).
"""

from __future__ import annotations

import os
import select
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from monarch._src.runtime.loop_replies import AddressPool, ReplyAddress, RuntimeHooks
from monarch._src.transport.socket_reader import ReaderSet, SocketReader, ready_fds

if TYPE_CHECKING:
    from monarch._src.runtime.runtime import Runtime

#: The longest the holder waits in one poll before it looks whether its address was closed.
POLL_SLICE_S = 1.0
#: At most this many thread addresses per process (each costs every peer that replies to it a
#: connection); further threads' replies come to the process's own address, as without them.
MAX_ADDRESSES = 32


class _Held(threading.local):
    """The calling thread's lease of a reply address (a class default: most threads have none)."""

    lease: _Lease | None = None


class _Lease:
    """Kept by its thread alone: when the thread ends, it is collected and its address given back."""

    __slots__ = ("address", "__weakref__")

    def __init__(self, address: ThreadAddress) -> None:
        self.address = address


class ThreadReplies:
    """The reply addresses of one runtime, lent to the threads calls are made on."""

    def __init__(self, rt: Runtime, hooks: RuntimeHooks, enabled: bool, addresses: set[str]) -> None:
        """``enabled``: False under TLS (an encrypted connection cannot change hands after its
        handshake); ``addresses``: the runtime's set of reply addresses, which this adds to."""
        self._rt = rt
        self._enabled = enabled
        self._held = _Held()
        self._pool = AddressPool(rt, hooks, ThreadAddress, addresses, MAX_ADDRESSES)

    def address_for_thread(self) -> str:
        """(a thread with no running event loop) The address replies to a call made here come to."""
        lease = self._held.lease
        if lease is not None:
            return lease.address.address
        if not self._enabled or self._rt.closed:
            return self._rt.address
        lent = self._pool.take("a thread")
        if lent is None:
            return self._rt.address
        lent.lend_to(threading.get_ident())
        lease = self._held.lease = _Lease(lent)
        weakref.finalize(lease, self._pool.give_back, lent)  # when its thread ends
        return lent.address

    def of_this_thread(self) -> ThreadAddress | None:
        """The address lent to the calling thread, if any (``Future.get`` waits through it)."""
        lease = self._held.lease
        return lease.address if lease is not None else None

    def close(self) -> None:
        """(runtime's loop) Stop accepting and close every connection."""
        self._pool.close()


class _Wake:
    """What a future resolved on another thread releases to wake the holder waiting for it."""

    __slots__ = ("_fd", "_ident")

    def __init__(self, fd: int, ident: int) -> None:
        self._fd = fd
        self._ident = ident

    def release(self) -> None:
        if threading.get_ident() != self._ident:  # the holder itself needs no waking
            os.eventfd_write(self._fd, 1)


class ThreadAddress(ReplyAddress):
    """One reply address whose connections are read by the thread it is lent to while that
    thread waits in ``Future.get()``, and by the runtime's loop the rest of the time."""

    def __init__(self, rt: Runtime, hooks: RuntimeHooks) -> None:
        super().__init__(rt, hooks)
        #: Connections the runtime's loop reads: all of them, but while the holder waits.
        self._loop_set = ReaderSet()
        #: Connections the holder reads while it waits, and its wake-up descriptor.
        self._own_poll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._own_poll.register(self._wake_fd, select.EPOLLIN)
        #: Set on every lending: released by a future the holder waits for.
        self.waker = _Wake(self._wake_fd, 0)
        #: Connections that said hello, by descriptor.
        self._by_fd: dict[int, SocketReader] = {}
        #: The holder is in ``wait`` (its connections are off in ``_loop_set``).
        self._waiting = False
        self.closed = False
        rt.loop_thread.call_soon(self._loop_set.watch, rt.loop)

    def lend_to(self, ident: int) -> None:
        self.waker = _Wake(self._wake_fd, ident)

    # -- the holder ---------------------------------------------------------------------------------

    def wait(self, future: Any, timeout: float | None) -> bool | None:
        """(the holder) Read this address's connections until ``future`` is done (True), for at
        most ``timeout`` seconds (False); None, at once, where this cannot wait (the address is
        closed, or this wait is inside another one: a frame read here led to a ``get()``)."""
        with self.lock:
            if self.closed or self._waiting:
                return None
            self._waiting = True
            self._loop_set.switch(False)
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not future.done():
                slice_s = POLL_SLICE_S
                if deadline is not None:
                    slice_s = min(slice_s, deadline - time.monotonic())
                    if slice_s <= 0:
                        return False
                try:
                    ready = ready_fds(self._own_poll, slice_s, self._wake_fd)
                except (OSError, ValueError):  # closed meanwhile
                    return None if not future.done() else True
                for fd in ready:
                    reader = self._by_fd.get(fd)
                    if reader is not None:
                        reader.read(True)
                if self.closed and not future.done():
                    return None
            return True
        finally:
            with self.lock:
                self._waiting = False
                if not self.closed:
                    self._loop_set.switch(True)

    # -- the runtime's loop -------------------------------------------------------------------------

    def _reader_ready(self, reader: SocketReader) -> None:
        reader.unwatch(self._rt.loop)  # from now on through ``_loop_set``, or the holder
        fd = reader.fileno()
        with self.lock:
            if self.closed:
                return
            self._by_fd[fd] = reader
            self._loop_set.add(reader)  # (switched off while the holder waits)
            self._own_poll.register(fd, select.EPOLLIN)

    def _reader_gone(self, reader: SocketReader) -> None:
        fd = reader.fileno()
        self._loop_set.discard(reader)
        if self._by_fd.get(fd) is reader:
            del self._by_fd[fd]
            try:
                self._own_poll.unregister(fd)
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        """(runtime's loop) Also wakes a holder waiting now (it then waits without this address);
        the descriptors stay open, as a future may still release the holder's wake-up."""
        with self.lock:
            self.closed = True
        self._loop_set.unwatch(self._rt.loop)
        super().close()
        os.eventfd_write(self._wake_fd, 1)
