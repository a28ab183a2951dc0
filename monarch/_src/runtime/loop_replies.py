"""Replies read by the event loop that awaits them, not handed over by the runtime's loop.

A coroutine on a loop of the user's own (``asyncio.run`` on the main thread, a notebook, an
async web service) awaiting a remote call used to get its reply in two steps: the runtime's
loop thread read it, then woke the awaiting loop (``call_soon_threadsafe``: a second wake-up,
tens of microseconds on a VM, on every reply). Here a call made on such a loop L names a reply
address of L's own: a listening socket of this process whose connections are accepted and
authenticated on the runtime's loop, as every connection is (nothing is decoded before), and
then watched by L itself (``SocketReader``), so a reply wakes L directly, as in a bare socket
program. All replies to one port come on one connection per sender: their order holds.

Each such address is lent to one loop at a time. The runtime's loop watches its connections
too whenever that loop may not read them: before it watches a new connection, while it is
not running (checked every ``WATCH_S``), while its own thread blocks in ``Future.get()``
(``before_blocking_wait``), and once it is closed. The first reader to wake reads, under the
connection's lock, so nothing is read twice or out of order, and no reply waits on a loop that
cannot run. When the loop shuts down (``asyncio.run`` ending: the loop closes its async
generators, one of which is this module's) or is found closed, the address goes back to a pool
for the next loop, and replies still on their way are read by the runtime's loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from monarch._src.transport import address as addresses
from monarch._src.transport.connection import REPLY_SCRATCH_BYTES, IncomingConnection
from monarch._src.transport.listener import Listener
from monarch._src.transport.socket_reader import ReaderSet, SocketReader
from monarch._src.wire.protocol import KIND, PORT_BATCH_KIND, PORT_KIND

if TYPE_CHECKING:
    from monarch._src.runtime.runtime import Runtime

logger = logging.getLogger("monarch.runtime")

#: How often the runtime's loop looks for loops that stopped running or closed.
WATCH_S = 1.0
_REPLY_KINDS = (PORT_KIND, PORT_BATCH_KIND)


@dataclass(frozen=True)
class RuntimeHooks:
    """What the runtime does with the frames and connections of every address, these too."""

    #: Route a frame (on any thread).
    route: Callable[[dict, list], None]
    #: A frame this process could not take (see ``IncomingConnection``).
    reject: Callable[[dict, BaseException], None]
    #: The peer's hello: ``first_frame(conn, header, bodies, route)``.
    first_frame: Callable[[IncomingConnection, dict, list, Callable[[dict, list], None]], None]
    #: (runtime's loop) A connection from a peer closed.
    incoming_closed: Callable[[IncomingConnection, BaseException | None], None]


A = TypeVar("A", bound="ReplyAddress")


class AddressPool(Generic[A]):
    """Reply addresses made when first needed and reused once given back."""

    def __init__(
        self,
        rt: Runtime,
        hooks: RuntimeHooks,
        make: Callable[[Runtime, RuntimeHooks], A],
        addresses: set[str],
        limit: int | None = None,
    ) -> None:
        """``addresses``: the runtime's set of every reply address, which this adds to;
        ``limit``: at most this many addresses."""
        self._rt = rt
        self._hooks = hooks
        self._make = make
        self._addresses = addresses
        self._limit = limit
        self._free: list[A] = []
        self._all: list[A] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self, what: str) -> A | None:
        """A free address, or a new one; None where there is none to have (out of descriptors,
        or at the limit): replies then come to the runtime's own address. ``what``: whose."""
        with self._lock:
            lent = self._free.pop() if self._free else None
            if lent is None and self._limit is not None and len(self._all) >= self._limit:
                return None
        if lent is None:
            try:
                lent = self._make(self._rt, self._hooks)
            except OSError as e:  # out of descriptors, say: the runtime's own address still works
                logger.warning("no reply address for %s (%s); replies go through the runtime", what, e)
                return None
            with self._lock:
                self._all.append(lent)
            self._addresses.add(lent.address)
        return lent

    def give_back(self, lent: A) -> None:
        with self._lock:
            if not self._closed:
                self._free.append(lent)

    def close(self) -> None:
        """(runtime's loop) Stop accepting and close every connection."""
        with self._lock:
            self._closed = True
            every, self._free = list(self._all), []
        for lent in every:
            lent.close()


class LoopReplies:
    """The reply addresses of one runtime, lent to the loops calls are made on."""

    def __init__(self, rt: Runtime, hooks: RuntimeHooks, enabled: bool) -> None:
        self._rt = rt
        #: False under TLS: an encrypted connection cannot change hands after its handshake.
        self._enabled = enabled
        self._lent: dict[asyncio.AbstractEventLoop, _ReplyAddress] = {}
        self._lock = threading.Lock()
        self._watching = False
        #: Every reply address: frames sent to one of them from this process stay in it.
        self.addresses: set[str] = set()
        self._pool = AddressPool(rt, hooks, _ReplyAddress, self.addresses)

    def address_for(self, loop: asyncio.AbstractEventLoop) -> str:
        """(``loop``'s thread, ``loop`` running) The address replies to a call made here come to."""
        lent = self._lent.get(loop)
        if lent is not None:
            return lent.address
        if not self._enabled or self._rt.closed or getattr(loop, "_asyncgens_shutdown_called", False):
            return self._rt.address  # (a loop shutting down would not close the sentinel)
        lent = self._pool.take("an event loop")
        if lent is None:
            return self._rt.address
        with self._lock:
            self._lent[loop] = lent
            watch = not self._watching
            self._watching = True
        lent.lend_to(loop, _until_shutdown(self, loop))
        if watch:
            self._rt.loop_thread.call_soon(self._watch)
        return lent.address

    def give_back(self, loop: asyncio.AbstractEventLoop) -> None:
        """(``loop``'s thread, or any once it is closed) ``loop`` reads no more replies."""
        with self._lock:
            lent = self._lent.pop(loop, None)
        if lent is None:
            return
        lent.release(loop)
        self._pool.give_back(lent)

    def before_blocking_wait(self) -> Callable[[], None] | None:
        """Called by a thread about to block until a result comes (``Future.get``): if the loop
        running on it reads replies, the runtime's loop reads them until the returned function
        is called; None where there is nothing to do."""
        if not self._lent:
            return None
        loop = asyncio._get_running_loop()
        lent = self._lent.get(loop) if loop is not None else None  # type: ignore[arg-type]
        if lent is None:
            return None
        return lent.block()

    def _watch(self) -> None:
        """(runtime's loop) Read for the lent loops that stopped running; take back closed ones."""
        for loop, lent in list(self._lent.items()):
            if loop.is_closed():
                lent.end_sentinel()
                self.give_back(loop)
            else:
                lent.check()
        with self._lock:
            self._watching = bool(self._lent) and not self._rt.closed
            if not self._watching:
                return
        self._rt.loop.call_later(WATCH_S, self._watch)

    def close(self) -> None:
        """(runtime's loop) Stop accepting and close every connection."""
        with self._lock:
            self._lent = {}
        self._pool.close()


async def _until_shutdown(
    replies: LoopReplies, loop: asyncio.AbstractEventLoop
) -> AsyncGenerator[None, None]:
    """Iterated once on ``loop``, which then closes it when it shuts down its async generators."""
    try:
        yield
    finally:
        replies.give_back(loop)


class ReplyAddress:
    """A listening socket of this process for replies: its connections are accepted and
    authenticated on the runtime's loop, as every connection is, and after the peer's hello
    read by whoever the subclass lends them to (``_reader_ready``)."""

    def __init__(self, rt: Runtime, hooks: RuntimeHooks) -> None:
        self._rt = rt
        self._hooks = hooks
        sock = rt.new_reply_socket()
        self.address = addresses.of_listening_socket(sock)
        #: Guards the connections (and what subclasses keep of them).
        self.lock = threading.Lock()
        #: Authenticated connections, and the ones still in their handshake.
        self._readers: dict[IncomingConnection, SocketReader] = {}
        self._ready: set[SocketReader] = set()
        self._listener = Listener(rt.loop, sock, self._new_incoming, attach=self._attach)
        rt.loop_thread.call_soon(self._listener.start)

    def _new_incoming(self) -> IncomingConnection:
        rt = self._rt
        conn = IncomingConnection(
            secret=rt.secret,
            max_frame_bytes=rt.max_frame_bytes,
            on_frame=lambda header, bodies: self._first_frame(conn, header, bodies),
            on_reject=self._hooks.reject,
            on_close=self._closed,
            name=f"<-{self.address}",
            local_address=self.address,
            defer_cut_off=True,  # settled with the peer's next hello (``incoming_closed``)
            scratch_bytes=REPLY_SCRATCH_BYTES,  # (one connection per worker per address)
        )
        return conn

    def _attach(self, conn: IncomingConnection, sock: socket.socket) -> None:
        reader = SocketReader(sock, conn)
        with self.lock:
            self._readers[conn] = reader
        conn.connection_made(reader)
        reader.watch(self._rt.loop)

    def _first_frame(self, conn: IncomingConnection, header: dict, bodies: list) -> None:
        """(runtime's loop) The peer's hello, after the handshake: from now on its holder reads."""
        self._hooks.first_frame(conn, header, bodies, self._route)
        with self.lock:
            reader = self._readers.get(conn)
            if reader is None:
                return
            self._ready.add(reader)
        self._reader_ready(reader)

    def _reader_ready(self, reader: SocketReader) -> None:
        """(runtime's loop, inside a read of ``reader``) Hand a connection that said hello to
        whoever reads this address."""
        raise NotImplementedError

    def _route(self, header: dict, bodies: list) -> None:
        """Replies go to their ports from whichever thread read them; anything else a peer may
        send here is the runtime loop's to handle, as on the runtime's own address."""
        route = self._hooks.route
        if header.get(KIND) in _REPLY_KINDS or self._rt.on_loop_thread():
            route(header, bodies)
        else:
            self._rt.loop_thread.call_soon(route, header, bodies)

    def _closed(self, conn: IncomingConnection, reason: BaseException | None) -> None:
        with self.lock:
            reader = self._readers.pop(conn, None)
            if reader is not None:
                self._ready.discard(reader)
                self._reader_gone(reader)
        self._rt.loop_thread.call_soon(self._hooks.incoming_closed, conn, reason)

    def _reader_gone(self, reader: SocketReader) -> None:
        """(lock held, before its socket closes) A connection that ended."""

    def close(self) -> None:
        """(runtime's loop)"""
        self._listener.close()
        addresses.remove_socket_file(self.address)
        with self.lock:
            readers = list(self._readers.values())
        for reader in readers:
            reader.close()


class _ReplyAddress(ReplyAddress):
    """One reply address whose connections are read by the loop it is lent to.

    Past its hello, each connection is in two ``ReaderSet``s (nested epoll sets, each watched as
    one descriptor, so that a socket's error never ends its watch, as uvloop's would): the one
    its holder watches, and the one the runtime's loop watches, switched on while the holder
    may not read."""

    def __init__(self, rt: Runtime, hooks: RuntimeHooks) -> None:
        super().__init__(rt, hooks)
        #: The loop reading replies now (None: only the runtime's).
        self._holder: asyncio.AbstractEventLoop | None = None
        self._holder_set = ReaderSet()
        self._loop_set = ReaderSet()
        rt.loop_thread.call_soon(self._loop_set.watch, rt.loop)
        #: Threads of the holder blocked in ``Future.get()`` right now.
        self._blocked = 0
        #: A pulse sent to the holder has not run yet; it had not at the last check either.
        self._pulse_pending = False
        self._stuck = False
        self._sentinel: AsyncGenerator[None, None] | None = None

    # -- lending (the holder's thread) ------------------------------------------------------------

    def lend_to(self, loop: asyncio.AbstractEventLoop, sentinel: AsyncGenerator[None, None]) -> None:
        self._holder_set.watch(loop)
        with self.lock:
            self._holder = loop
            self._pulse_pending = self._stuck = False
        self._sentinel = sentinel
        try:  # registered with ``loop`` (its first-iteration hook), which closes it at shutdown
            sentinel.asend(None).send(None)
        except StopIteration:
            pass
        self._rt.loop_thread.call_soon(self.settle)

    def release(self, loop: asyncio.AbstractEventLoop) -> None:
        with self.lock:
            if self._holder is loop:
                self._holder = None
            self._blocked = 0
            self._sentinel = None
        self._rt.loop_thread.call_soon(self.settle)
        self._holder_set.unwatch(loop)

    def end_sentinel(self) -> None:
        """(runtime's loop) The holder closed without shutting down its async generators: end
        ours here, so that nothing asks the closed loop to finalize it later."""
        sentinel, self._sentinel = self._sentinel, None
        if sentinel is not None:
            try:
                sentinel.aclose().send(None)
            except (StopIteration, RuntimeError):
                pass

    def block(self) -> Callable[[], None]:
        with self.lock:
            self._blocked += 1
        self._rt.loop_thread.call_soon(self.settle)

        def unblock() -> None:
            with self.lock:
                self._blocked = max(0, self._blocked - 1)
            self._rt.loop_thread.call_soon(self.settle)

        return unblock

    # -- the runtime's loop -----------------------------------------------------------------------

    def check(self) -> None:
        """(every ``WATCH_S``) A holder that did not run a callback sent a check ago is stuck
        (not running, or its thread blocked in anything but ``Future.get``): read for it."""
        holder = self._holder
        if holder is None:
            return
        self._stuck = self._pulse_pending
        if not self._pulse_pending:
            self._pulse_pending = True
            try:
                holder.call_soon_threadsafe(self._pulse)
            except RuntimeError:  # closed: the next check gives the address back
                pass
        self.settle()

    def _pulse(self) -> None:
        self._pulse_pending = False

    def settle(self) -> None:
        """Read from the runtime's loop too while the holder may not read now."""
        holder = self._holder
        self._loop_set.switch(
            holder is None
            or self._blocked > 0
            or self._stuck
            or holder.is_closed()
            or not holder.is_running()
        )

    def _reader_ready(self, reader: SocketReader) -> None:
        reader.unwatch(self._rt.loop)  # from now on through the sets (its handshake is over)
        with self.lock:
            if reader not in self._ready:  # it ended meanwhile
                return
            self._holder_set.add(reader)
            self._loop_set.add(reader)

    def _reader_gone(self, reader: SocketReader) -> None:
        self._holder_set.discard(reader)
        self._loop_set.discard(reader)

    def close(self) -> None:
        self._loop_set.unwatch(self._rt.loop)
        super().close()
