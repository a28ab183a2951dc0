"""Peers' connections read by the thread their messages are for, while that thread is idle.

A message for a sync actor (its endpoints run on a thread of its own, never on the loop) used to
cost its process two wake-ups: the runtime's loop thread was woken by the socket, read and
routed the frame into the actor's mailbox, which woke the actor's thread. Here, while that
thread has nothing to run, it reads the connections its messages came on itself (its
``IdleReader``), so a message wakes only it, as in a bare socket program; while it runs an
endpoint, the runtime's loop reads them, so a long endpoint starves nothing else (stops, other
actors' messages, acknowledgements of frames read).

The mechanism is ``thread_replies``'. A connection accepted on the runtime's address is read
by the loop's own transport until the loop routes a message from it to a sync actor; it then
moves (``_to_reader``) to a ``SocketReader`` of a duplicate of its socket, in one nested epoll
set (``_loop_poll``) that the loop watches as one descriptor (not each with ``add_reader``:
uvloop stops watching a socket for good when it reports an error, so a reset would go
unread), and is lent to that actor's thread (``claim``: in the thread's own epoll set too,
with its wake-up descriptor); the thread switches it off in the loop's set itself while it
waits (``epoll_ctl``, no hop to the loop) and on again before it runs anything. A connection
that only ever carries messages for async actors stays on the loop's transport. Whoever reads
does so under the connection's lock, so nothing is read twice or out of order; what is queued
for the thread meanwhile (from the loop, or from this process) wakes it (``wake``).

What the idle thread reads, it delivers only where that keeps every guarantee the loop gives:
``deliver`` (the actor layer's) takes a frame straight to a sync actor's mailbox, or declines
it (a spawn, a stop, a frame numbered for a forwarder's order, shared memory to map, anything
else for the loop). A declined frame, and every frame read after it on that connection, go to
the loop in one callback (``_take_back``), with the connection switched back to the loop only
once they were routed: nothing read later overtakes them. A connection's end, and frames it
could not take, go the same way. Frames read are counted and acknowledged by the connection as
ever (``read_count``), whichever thread reads; a connection whose frames wait for, or are
waited on by, a peer's other connection (``behind``) is the loop's alone (``pin``).

A worker's runtime only (a client's loop reads its replies faster from uvloop's own
transports), and not under TLS (an encrypted connection cannot change hands after its
handshake).
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch._src.transport.connection import IncomingConnection
from monarch._src.transport.socket_reader import SocketReader, ready_fds

if TYPE_CHECKING:
    from monarch._src.runtime.runtime import Runtime

#: The longest an idle reader polls before it looks whether the runtime closed.
POLL_SLICE_S = 1.0
#: At most this many connections are lent to one thread (each costs two ``epoll_ctl`` calls
#: per idle spell); the loop reads the rest.
MAX_LENT = 8

#: Takes a frame (header, bodies) read on an idle thread where it must go; False: it is the
#: loop's to route (with every frame after it on its connection).
Deliver = Callable[[dict, list], bool]


class _Shared:
    """One connection the runtime's loop may lend to an idle thread."""

    __slots__ = (
        "reader",
        "conn",
        "fd",
        "affinity",
        "holder",
        "handing",
        "unrouted",
        "pinned",
        "paused",
        "gone",
    )

    def __init__(self, conn: IncomingConnection) -> None:
        #: Its socket, once it left the loop's own transport (``_to_reader``).
        self.reader: SocketReader | None = None
        self.conn = conn
        self.fd = -1
        #: The idle reader its messages were last for: it reads it while idle.
        self.affinity: IdleReader | None = None
        #: The idle reader reading it now (it is off in the loop's set meanwhile).
        self.holder: IdleReader | None = None
        #: Frames its idle reader declined are on their way to the loop: nobody reads it.
        self.handing = False
        #: Of those, how many frames the loop has not routed yet.
        self.unrouted = 0
        #: The loop's alone (its frames wait for, or are waited on by, a peer's other connection).
        self.pinned = False
        #: Not read until resumed (``behind``: it waits for a connection it replaces).
        self.paused = False
        self.gone = False


class IdleReads:
    """The runtime's connections that idle threads may read (see the module docstring)."""

    def __init__(
        self,
        rt: Runtime,
        enabled: bool,
        closed: Callable[[IncomingConnection, BaseException | None], None],
        reject: Callable[[dict, BaseException], None],
        read_routed: Callable[[], None],
    ) -> None:
        """The runtime's hooks, run on its loop for these connections as for any other:
        ``closed`` (a connection ended), ``reject`` (a frame it could not take),
        ``read_routed`` (every frame of a read was routed)."""
        self._rt = rt
        self.enabled = enabled
        self._closed = closed
        self._reject = reject
        self._read_routed = read_routed
        self._lock = threading.Lock()
        self._of: dict[IncomingConnection, _Shared] = {}
        self._by_fd: dict[int, _Shared] = {}
        #: (runtime's loop) The connection whose read is being routed now.
        self.reading: _Shared | None = None
        self._loop_poll = select.epoll() if enabled else None
        if self._loop_poll is not None:
            rt.loop_thread.call_soon(rt.loop.add_reader, self._loop_poll.fileno(), self._loop_readable)

    # -- the runtime's loop -----------------------------------------------------------------------

    def _to_reader(self, shared: _Shared) -> bool:
        """(runtime's loop, inside a read of ``shared``'s transport) Move a connection off the
        loop's own transport to a ``SocketReader`` of a duplicate of its socket, polled in
        ``_loop_poll``: from now on an idle thread may read it. False where it cannot move
        now (the transport has bytes still to write, or is closing)."""
        conn = shared.conn
        transport = conn.transport
        if transport is None or transport.is_closing() or transport.get_write_buffer_size():
            return False
        sock = transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            dup = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:
            return False
        dup.setblocking(False)
        transport.pause_reading()  # (it reads no more: the duplicate keeps the connection open)
        transport.set_protocol(asyncio.Protocol())  # its close is not the connection's
        transport.abort()
        reader = SocketReader(dup, conn, lambda paused: self._pause(shared, paused))
        # Nobody else reads it before the transport's read returns (and lets go of the buffer
        # it was reading into): the loop lets go of its lock once this callback is over.
        reader.lock.acquire()
        self._rt.loop.call_soon(reader.lock.release)
        conn.transport = reader
        with self._lock:
            shared.reader, shared.fd = reader, reader.fileno()
            self._by_fd[shared.fd] = shared
            self._loop_poll.register(shared.fd, self._loop_mask(shared))  # type: ignore[union-attr]
        return True

    def read_done(self, conn: IncomingConnection) -> None:
        """(runtime's loop) The frames of a read of ``conn`` were routed: ``read_routed``, with
        ``conn`` the connection read (``claim``)."""
        self.reading = self._of.get(conn)
        try:
            self._read_routed()
        finally:
            self.reading = None

    def _pause(self, shared: _Shared, paused: bool) -> None:
        """(runtime's loop) Stop or resume reading a connection (pinned: no idle thread holds it)."""
        with self._lock:
            shared.paused = paused
            if not shared.handing and not shared.gone:
                self._loop_poll.modify(shared.fd, self._loop_mask(shared))  # type: ignore[union-attr]

    @staticmethod
    def _loop_mask(shared: _Shared) -> int:
        return 0 if shared.paused else select.EPOLLIN

    def said_hello(self, conn: IncomingConnection) -> None:
        """(runtime's loop) ``conn`` is past its hello and its frames go straight to the router:
        an idle thread may read it from now on."""
        if not self.enabled or conn.closed:  # (nothing would take it out of ``_of``: ``ended``)
            return
        shared = self._of.get(conn)
        if shared is None:
            self._of[conn] = _Shared(conn)
        else:
            shared.pinned = False

    def pin(self, conn: IncomingConnection) -> None:
        """(runtime's loop) Only the loop reads ``conn`` from now on (its frames are about to be
        routed otherwise: a peer's connection replacing it waits for them)."""
        shared = self._of.get(conn)
        if shared is None:
            return
        shared.pinned = True
        if shared.reader is None:
            return
        with shared.reader.lock, self._lock:
            self._unlend(shared)
            if not shared.handing and not shared.gone:
                self._loop_poll.modify(shared.fd, self._loop_mask(shared))  # type: ignore[union-attr]

    def unrouted(self, conn: IncomingConnection) -> int:
        """(runtime's loop) Frames of ``conn`` read (by an idle thread) but not routed yet."""
        shared = self._of.get(conn)
        return shared.unrouted if shared is not None else 0

    def claim(self, idle: IdleReader) -> None:
        """(runtime's loop, routing a read) The connection read now carried messages for
        ``idle``'s thread: that thread reads it while it is idle."""
        shared = self.reading
        if shared is None or shared.affinity is idle or shared.pinned or shared.handing or shared.gone:
            return
        if shared.reader is None and not self._to_reader(shared):
            return
        with self._lock:
            if shared.gone or idle.closed:
                return
            self._unlend(shared)
            if len(idle.lent) >= MAX_LENT:  # the one whose messages came longest ago
                self._unlend(next(iter(idle.lent.values())))
            shared.affinity = idle
            idle.lend(shared)

    def _unlend(self, shared: _Shared) -> None:
        """(lock held) ``shared`` leaves its idle reader, if any."""
        if shared.affinity is not None:
            shared.affinity.unlend(shared)
            shared.affinity = None
        shared.holder = None

    def _loop_readable(self) -> None:
        """Read the connections no idle thread holds (one that reads now reads on while it is
        able: left to it)."""
        try:
            events = self._loop_poll.poll(0)  # type: ignore[union-attr]
        except (OSError, ValueError):  # closed
            return
        by_fd = self._by_fd
        for fd, _ in events:
            shared = by_fd.get(fd)
            if shared is None:
                continue
            lock = shared.reader.lock  # type: ignore[union-attr]
            if not lock.acquire(False):
                continue
            try:
                if shared.holder is None and not shared.handing:
                    self.reading = shared
                    shared.reader.read_locked()  # type: ignore[union-attr]
            finally:
                self.reading = None
                lock.release()

    def _take_back(self, shared: _Shared, frames: list[tuple[dict, Any, BaseException | None]]) -> None:
        """(runtime's loop) Route what an idle thread declined, then read the connection on."""
        conn = shared.conn
        self.reading = shared
        try:
            for header, bodies, error in frames:
                if header is None:  # the connection ended there
                    self._closed(conn, error)
                    continue
                shared.unrouted -= 1  # (before: a connection waiting on this one looks at it)
                if error is None:
                    conn.on_frame(header, bodies)
                else:
                    self._reject(header, error)
            self._read_routed()
        finally:
            self.reading = None
        with self._lock:
            shared.handing = False
            if not shared.gone:
                self._loop_poll.modify(shared.fd, self._loop_mask(shared))  # type: ignore[union-attr]

    def ended(self, conn: IncomingConnection, reason: BaseException | None) -> None:
        """``conn`` ended (on whichever thread read its end): it leaves every set before its
        socket closes, and the runtime's loop hears of it after the frames read before it."""
        rt = self._rt
        shared = self._of.pop(conn, None)
        handing = False
        if shared is not None and shared.reader is not None:
            with self._lock:
                shared.gone = True
                handing = shared.handing
                self._unlend(shared)
                self._by_fd.pop(shared.fd, None)
                try:
                    self._loop_poll.unregister(shared.fd)  # type: ignore[union-attr]
                except (OSError, ValueError):
                    pass
            idle = _current.reader
            if idle is not None and idle.reading is shared:
                idle.decline(None, None, reason)
                return
        if handing or not rt.on_loop_thread():  # after what was handed to the loop before
            rt.loop_thread.call_soon(self._closed, conn, reason)
        else:
            self._closed(conn, reason)

    def close(self) -> None:
        """(runtime's loop) Stop watching; connections are closed by the runtime."""
        if self._loop_poll is not None:
            try:
                self._rt.loop.remove_reader(self._loop_poll.fileno())
            except (ValueError, OSError):
                pass

    # -- for idle readers -----------------------------------------------------------------------

    def _hand_to_loop(self, idle: IdleReader, shared: _Shared, frames: list) -> None:
        """(the idle thread, inside its read of ``shared``) What it declined goes to the loop;
        nobody reads the connection until the loop routed it (``_take_back``)."""
        with self._lock:
            shared.handing = True
            shared.unrouted = sum(1 for header, _, _ in frames if header is not None)
            self._unlend(shared)
        self._rt.loop_thread.call_soon(self._take_back, shared, frames)

    def take(self, idle: IdleReader, held: dict[int, _Shared]) -> None:
        """(the idle thread) Hold the connections lent to it: the loop stops reading them."""
        with self._lock:
            idle.holding = True
            for shared in held.values():
                shared.holder = idle
                self._loop_poll.modify(shared.fd, 0)  # type: ignore[union-attr]

    def give_back(self, idle: IdleReader, held: dict[int, _Shared]) -> None:
        """(the idle thread) The loop reads them again."""
        with self._lock:
            idle.holding = False
            for shared in held.values():
                shared.holder = None
                self._loop_poll.modify(shared.fd, select.EPOLLIN)  # type: ignore[union-attr]


class _Current(threading.local):
    reader: IdleReader | None = None


_current = _Current()


class IdleReader:
    """The connections one thread reads while it waits for work (``wait``)."""

    def __init__(self, reads: IdleReads, deliver: Deliver) -> None:
        self._reads = reads
        self._deliver = deliver
        self._own_poll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._own_poll.register(self._wake_fd, select.EPOLLIN)
        #: Lent to it (``claim``), by descriptor, oldest first; in ``_own_poll``.
        self.lent: dict[int, _Shared] = {}
        #: In ``wait`` (its work's producers wake it through ``wake``).
        self.waiting = False
        self.closed = False
        #: Holding its connections (``IdleReads._lock``).
        self.holding = False
        #: The connection it reads now, and what it declined of that read, for the loop.
        self.reading: _Shared | None = None
        self._declined: list[tuple[dict | None, Any, BaseException | None]] | None = None
        self._routing = (self._frame, self._reject, self._read_done)

    def close(self) -> None:
        """(its thread, ending) Its connections are the loop's for good."""
        with self._reads._lock:
            self.closed = True
            self.waiting = False
            for shared in list(self.lent.values()):
                self._reads._unlend(shared)
        self._own_poll.close()
        os.close(self._wake_fd)

    def claim(self) -> None:
        """(runtime's loop, routing a read) Its thread reads the connection read now while idle."""
        self._reads.claim(self)

    def wake(self) -> None:
        """(any thread) Work for it was queued: stop waiting."""
        if self.waiting:
            os.eventfd_write(self._wake_fd, 1)

    def lend(self, shared: _Shared) -> None:
        """(lock held) Read ``shared`` while idle; held at once if idle now."""
        self.lent[shared.fd] = shared
        self._own_poll.register(shared.fd, select.EPOLLIN)
        if self.holding:
            shared.holder = self
            self._reads._loop_poll.modify(shared.fd, 0)  # type: ignore[union-attr]

    def unlend(self, shared: _Shared) -> None:
        """(lock held)"""
        if self.lent.pop(shared.fd, None) is shared:
            try:
                self._own_poll.unregister(shared.fd)
            except (OSError, ValueError):
                pass

    def wait(self, ready: Callable[[], bool]) -> None:
        """(its thread) Read its connections until ``ready()`` (its work was queued)."""
        self.waiting = True
        try:
            if ready():
                return
            reads = self._reads
            lent = self.lent
            reads.take(self, lent)
            _current.reader = self
            try:
                while not ready() and not reads._rt.closed:
                    for fd in ready_fds(self._own_poll, POLL_SLICE_S, self._wake_fd):
                        shared = lent.get(fd)
                        if shared is not None:
                            self._read(shared)
            finally:
                _current.reader = None
                reads.give_back(self, lent)
        finally:
            self.waiting = False

    def _read(self, shared: _Shared) -> None:
        reader = shared.reader  # (a connection lent has one)
        with reader.lock:  # type: ignore[union-attr]
            if shared.holder is not self:
                return
            conn = shared.conn
            self.reading = shared
            self.waiting = False  # what it delivers to its own mailbox needs no wake-up
            routing = conn.swap_routing(self._routing)
            try:
                reader.read_locked()  # type: ignore[union-attr]
            finally:
                conn.swap_routing(routing)
                self.reading = None
                self.waiting = True  # (``wait`` looks at its work next)

    def _frame(self, header: dict, bodies: list) -> None:
        if self._declined is not None or not self._deliver(header, bodies):
            self.decline(header, bodies, None)

    def _reject(self, header: dict, error: BaseException) -> None:
        self.decline(header, None, error)

    def decline(self, header: dict | None, bodies: Any, error: BaseException | None) -> None:
        """The loop routes this (a frame; a frame not taken, with why; the end: no header)."""
        if self._declined is None:
            self._declined = []
        self._declined.append((header, bodies, error))
        if header is None:
            self._read_done()

    def _read_done(self) -> None:
        declined, self._declined = self._declined, None
        if declined is not None:
            self._reads._hand_to_loop(self, self.reading, declined)  # type: ignore[arg-type]
