"""Accepting connections on this process's listening socket.

The accept loop is this module's rather than the event loop's server because running out of
file descriptors must not end a process's reachability: uvloop closes a server whose accept
fails with EMFILE, after which every peer takes the (live) process for dead. Here the failure
is logged once, accepting pauses with backoff, and the peers wait in the listen backlog.

Connections that have not authenticated yet are capped at ``MAX_PENDING_HANDSHAKES``; past
that the oldest is dropped. A flood of idle strangers thus costs bounded memory and
descriptors, while a real peer, whose handshake takes one round trip, still gets in. The cap
is shared by every listener of one event loop (a process address and its reply addresses),
so a stranger who finds several of them cannot multiply it.

A TCP listener (see ``address``) works the same way, with Nagle's algorithm off on each
connection, and with TLS (see ``tls``) when it is given a context: the TLS handshake runs
first, bounded by ``HANDSHAKE_TIMEOUT_S`` and counted among the pending handshakes, and the
HMAC handshake then runs inside TLS. A client whose first byte does not start a TLS record (a
monarch client without TLS sends its nonce first) is told ``auth.TLS_ONLY`` and dropped, so it
fails at once rather than both sides waiting for the other; nothing it sent is decoded.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import weakref
from collections.abc import Callable

from monarch._src.transport import auth, tls
from monarch._src.transport.connection import HANDSHAKE_TIMEOUT_S, IncomingConnection

logger = logging.getLogger("monarch.transport")

MAX_PENDING_HANDSHAKES = 256
#: Accepts per wakeup, so a burst of connections does not starve the loop.
ACCEPT_BATCH = 64
#: First and longest pause of accepting after running out of descriptors or memory.
ACCEPT_RETRY_FIRST_S = 0.05
ACCEPT_RETRY_MAX_S = 1.0
#: Errors that a later accept may not hit again (resources of this process or the system).
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

#: Per event loop: the connections its listeners accepted that have not authenticated yet,
#: oldest first (a dict keeps order), with the task that sets each up (under TLS: runs its TLS
#: handshake). One table for all of a loop's listeners, so the cap counts them all.
_pending_of_loop: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[IncomingConnection, asyncio.Task[None] | None]
] = weakref.WeakKeyDictionary()


class Listener:
    """Accepts connections on ``sock`` (bound and listening) and hands each to a new
    ``IncomingConnection`` made by ``factory``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], IncomingConnection],
        tls: ssl.SSLContext | None = None,
        attach: Callable[[IncomingConnection, socket.socket], None] | None = None,
    ) -> None:
        """``attach(connection, socket)``: how an accepted socket starts feeding its connection
        (default: an asyncio transport of ``loop``; not with TLS)."""
        self._loop = loop
        self._attach = attach
        self._sock = sock
        self._factory = factory
        self._tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        self._tls = tls if self._tcp else None
        #: Shared with the loop's other listeners (see ``_pending_of_loop``).
        self._pending = _pending_of_loop.setdefault(loop, {})
        self._retry_delay = ACCEPT_RETRY_FIRST_S
        self._failures = 0
        self._evicted = 0
        self.closed = False
        sock.setblocking(False)

    def start(self) -> None:
        """(loop thread) Start accepting."""
        self._loop.add_reader(self._sock.fileno(), self._accept_ready)

    def close(self) -> None:
        """(loop thread) Stop accepting and close the listening socket."""
        if self.closed:
            return
        self.closed = True
        try:
            self._loop.remove_reader(self._sock.fileno())
        except (ValueError, OSError):
            pass
        self._sock.close()

    def _accept_ready(self) -> None:
        for accepted in range(ACCEPT_BATCH):
            try:
                conn_sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                if self._failures:  # the backlog is drained: the episode is over
                    logger.warning("accepting connections again (after %d failed attempts)", self._failures)
                    self._failures, self._retry_delay = 0, ACCEPT_RETRY_FIRST_S
                return
            except OSError as e:
                if e.errno in _TRANSIENT:
                    self._pause(e, progressed=accepted > 0)
                else:  # e.g. ECONNABORTED: that one connection is gone, the listener is fine
                    logger.warning("accepting a connection failed: %s", e)
                return
            conn_sock.setblocking(False)
            if self._tcp:
                conn_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._adopt(conn_sock)

    def _pause(self, error: OSError, progressed: bool) -> None:
        """Stop accepting for a while; the longer nothing could be accepted, the longer."""
        if not self._failures:
            logger.warning("cannot accept connections: %s; retrying with backoff (logged once)", error)
        self._failures += 1
        if progressed:  # descriptors do come free (closed connections): look again soon
            self._retry_delay = ACCEPT_RETRY_FIRST_S
        self._loop.remove_reader(self._sock.fileno())
        self._loop.call_later(self._retry_delay, self._resume)
        self._retry_delay = min(2 * self._retry_delay, ACCEPT_RETRY_MAX_S)

    def _resume(self) -> None:
        if not self.closed:
            self._loop.add_reader(self._sock.fileno(), self._accept_ready)

    def _adopt(self, conn_sock: socket.socket) -> None:
        conn = self._factory()
        conn.on_handshake_over = self._handshake_over
        if self._attach is not None:
            self._pending[conn] = None
            self._attach(conn, conn_sock)
        else:
            self._pending[conn] = self._loop.create_task(self._connect(conn, conn_sock))
        if len(self._pending) > MAX_PENDING_HANDSHAKES:
            self._evict()

    async def _connect(self, conn: IncomingConnection, conn_sock: socket.socket) -> None:
        try:
            if self._tls is None:
                await self._loop.connect_accepted_socket(lambda: conn, conn_sock)
            elif await asyncio.wait_for(self._starts_tls(conn_sock), HANDSHAKE_TIMEOUT_S):
                await self._loop.connect_accepted_socket(
                    lambda: conn, conn_sock, ssl=self._tls, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S
                )
            else:
                conn_sock.close()
                conn.abort(auth.HandshakeError("a client without TLS connected: told it TLS is required"))
        except (OSError, asyncio.TimeoutError) as e:  # under TLS: no valid certificate, or too slow
            conn_sock.close()
            conn.abort(e)
        except asyncio.CancelledError:  # evicted during its TLS handshake
            conn_sock.close()

    async def _starts_tls(self, conn_sock: socket.socket) -> bool:
        """Whether the client's first byte starts a TLS record; if not, what it sent is
        discarded and it is told ``auth.TLS_ONLY`` (the connection is still to be closed)."""
        readable: asyncio.Future[None] = self._loop.create_future()
        fd = conn_sock.fileno()
        self._loop.add_reader(fd, _set_once, readable)
        try:
            await readable
        finally:
            self._loop.remove_reader(fd)
        first = conn_sock.recv(1, socket.MSG_PEEK)
        if not first:
            raise ConnectionResetError("the client hung up before its TLS handshake")
        if first[0] == tls.HANDSHAKE_RECORD:
            return True
        conn_sock.recv(auth.CLIENT_PROOF_BYTES)  # read, so that closing sends a FIN, not a reset
        conn_sock.send(auth.TLS_ONLY)
        return False

    def _handshake_over(self, conn: IncomingConnection) -> None:
        """``conn`` authenticated or closed: it no longer counts, and is no longer kept here."""
        self._pending.pop(conn, None)

    def _evict(self) -> None:
        """Drop the oldest connections still waiting for their handshake, past the cap."""
        while len(self._pending) > MAX_PENDING_HANDSHAKES:
            oldest = next(iter(self._pending))
            if not self._evicted:
                logger.warning(
                    "more than %d connections are waiting for the handshake; dropping the oldest "
                    "(logged once)",
                    MAX_PENDING_HANDSHAKES,
                )
            self._evicted += 1
            setting_up = self._pending.pop(oldest)
            if oldest.transport is None and setting_up is not None:
                setting_up.cancel()
            oldest.abort(
                auth.HandshakeError("dropped: too many connections waiting for the handshake"), log=False
            )


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
