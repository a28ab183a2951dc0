"""Reading one accepted connection from whichever event loop is waiting for its frames.

An ``IncomingConnection`` (the handshake, then frames) normally sits on an asyncio transport of
the runtime's loop. A ``SocketReader`` drives the same protocol from a plain non-blocking
socket instead, and is its transport, so that the socket can be watched by several loops of
this process at once (``watch``): the loop whose thread awaits the replies that come on it
(one wake-up per reply, as in a bare socket program) and, while that loop is not running,
the runtime's. Whoever is woken reads under the reader's lock, so frames are parsed and
delivered one connection's worth at a time, in order, whatever thread reads them.

Each loop adds and removes its own watch on its own thread (asyncio's readers are not
thread-safe); the socket is closed once no open loop watches it. A loop that reads a connection
past its handshake watches it through a ``ReaderSet`` instead: one nested epoll set, which the
loop watches as one descriptor (see there why).
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import threading
from collections.abc import Callable
from typing import Any

from monarch._src.transport.connection import IncomingConnection


class SocketReader(asyncio.Transport):
    """Feeds ``protocol`` from ``sock``; its transport (the handshake's writes, ``close``)."""

    def __init__(
        self,
        sock: socket.socket,
        protocol: IncomingConnection,
        pause: Callable[[bool], None] | None = None,
    ) -> None:
        """``pause(paused)``: how its owner stops and resumes reading it (``pause_reading``); a
        reader without one cannot pause (its frames then queue in the protocol's owner)."""
        super().__init__()
        self._pause = pause
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        #: Held while reading and delivering, and while ending: one thread at a time, in socket
        #: order (reentrant: the protocol may end the connection from inside a read).
        self.lock = threading.RLock()
        #: The loops watching the socket now (each adds and removes itself on its own thread).
        self._watchers: set[asyncio.AbstractEventLoop] = set()
        self._watch_lock = threading.Lock()
        self._ended = False

    # -- watching -------------------------------------------------------------------------------

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """(``loop``'s thread) Read the socket whenever ``loop`` finds it readable."""
        with self._watch_lock:
            if self._ended or loop in self._watchers:
                return
            self._watchers.add(loop)
        loop.add_reader(self._fd, self.read, False)

    def unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        """(``loop``'s thread, or any thread once ``loop`` is closed) Stop watching from ``loop``."""
        with self._watch_lock:
            if loop not in self._watchers:
                return
            self._watchers.discard(loop)
            last = self._ended and not self._open_watchers()
        if not loop.is_closed():
            loop.remove_reader(self._fd)
        if last:
            self._sock.close()

    def fileno(self) -> int:
        return self._fd

    def _open_watchers(self) -> list[asyncio.AbstractEventLoop]:
        return [w for w in self._watchers if not w.is_closed()]

    # -- reading (any watching loop's thread, or a thread waiting for replies) -----------------------

    def read(self, wait: bool) -> None:
        """Read what the socket has and deliver its frames; ``wait``: if another thread is
        reading it now, wait for it and read after it (else leave the reading to it: it reads
        on while anything is left)."""
        if not self.lock.acquire(wait):
            return
        try:
            self.read_locked()
        finally:
            self.lock.release()

    def read_locked(self) -> None:
        """``read``, by a thread that holds ``lock``."""
        if self._ended:
            return
        proto = self._protocol
        try:
            n = self._sock.recv_into(proto.get_buffer(-1))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._end(e)
            return
        if not n:
            self._end(None)
            return
        proto.buffer_updated(n)

    def _end(self, exc: Exception | None) -> None:
        """The connection is over: the protocol hears of it, every watcher lets the socket go."""
        with self.lock, self._watch_lock:
            if self._ended:
                return
            self._ended = True
            watchers = list(self._watchers)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        with self.lock:
            self._protocol.connection_lost(exc)
        here = _running_loop()
        for loop in watchers:
            if loop is here or loop.is_closed():
                self.unwatch(loop)
            else:
                try:
                    loop.call_soon_threadsafe(self.unwatch, loop)
                except RuntimeError:  # closed meanwhile
                    self.unwatch(loop)
        with self._watch_lock:
            if not self._watchers:
                self._sock.close()

    # -- the transport the protocol writes to and closes --------------------------------------------

    def write(self, data: Any) -> None:
        """The handshake's few bytes; a socket that cannot take them at once is given up."""
        try:
            sent = self._sock.send(data)
        except OSError as e:
            self._end(e)
            return
        if sent != len(data):
            self._end(None)

    def pause_reading(self) -> None:
        if self._pause is None:
            raise NotImplementedError
        self._pause(True)

    def resume_reading(self) -> None:
        if self._pause is None:
            raise NotImplementedError
        self._pause(False)

    def abort(self) -> None:
        self._end(None)

    def close(self) -> None:
        self._end(None)

    def is_closing(self) -> bool:
        return self._ended

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sock if name == "socket" else default


def _running_loop() -> asyncio.AbstractEventLoop | None:
    return asyncio._get_running_loop()


def ready_fds(poll: select.epoll, timeout: float, wake_fd: int = -1) -> list[int]:
    """The descriptors of ``poll`` ready within ``timeout`` seconds, but ``wake_fd`` (an
    eventfd), which is only emptied: it just ends the wait."""
    ready = []
    for fd, _ in poll.poll(timeout):
        if fd == wake_fd:
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                pass
        else:
            ready.append(fd)
    return ready


class ReaderSet:
    """Connections (``SocketReader``) that an event loop watches as ONE descriptor: a nested
    epoll set, whose ready sockets it reads whenever the set is readable.

    Not each socket with ``add_reader``: libuv, hence uvloop, stops watching a descriptor for
    good once it reports an error (EPOLLERR: a TCP reset, a Unix peer that closed with data
    unread), having called its reader once at most; a socket whose error came with frames still
    unread would never be read to its end (never closed, its lost frames never settled, its
    peer's new connection waiting behind it). The set itself only ever reports that it is
    readable, and reports each socket, level-triggered, for as long as it has anything left.
    Sockets are added, removed and switched on or off from any thread (``epoll_ctl``: no hop to
    the loop)."""

    def __init__(self) -> None:
        self._poll = select.epoll()
        self._by_fd: dict[int, SocketReader] = {}
        #: Whether the loop reads the sockets now (``switch``).
        self._on = True
        self._lock = threading.Lock()

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """(``loop``'s thread) Read the sockets whenever ``loop`` finds one readable."""
        loop.add_reader(self._poll.fileno(), self._readable)

    def unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        """(``loop``'s thread, or any thread once ``loop`` is closed)"""
        if not loop.is_closed():
            loop.remove_reader(self._poll.fileno())

    def add(self, reader: SocketReader) -> None:
        with self._lock:
            self._by_fd[reader.fileno()] = reader
            self._poll.register(reader.fileno(), self._mask())

    def discard(self, reader: SocketReader) -> None:
        """(before ``reader``'s socket closes)"""
        fd = reader.fileno()
        with self._lock:
            if self._by_fd.get(fd) is reader:
                del self._by_fd[fd]
                try:
                    self._poll.unregister(fd)
                except (OSError, ValueError):
                    pass

    def switch(self, on: bool) -> None:
        """Read the sockets from now on, or leave them to others (they stay in the set)."""
        with self._lock:
            if on == self._on:
                return
            self._on = on
            for fd in self._by_fd:
                try:
                    self._poll.modify(fd, self._mask())
                except OSError:  # closing: ``discard`` is about to drop it
                    pass

    def _mask(self) -> int:
        return select.EPOLLIN if self._on else 0

    def _readable(self) -> None:
        readers = list(self._by_fd.values())
        if len(readers) == 1:  # (one peer, most often) no need to ask which: one syscall less
            readers[0].read(False)  # (if it has more, or it ended, the set is readable again)
            return
        try:
            ready = ready_fds(self._poll, 0)
        except (OSError, ValueError):  # closed
            return
        for fd in ready:
            reader = self._by_fd.get(fd)
            if reader is not None:
                reader.read(False)
