"""A framed, authenticated stream connection as an asyncio ``BufferedProtocol``.

Reading uses a scratch buffer for small data and hands the event loop the frame body's final
buffer for large bodies, so a 64 MiB array is read from the socket straight into the memory the
unpickled object will use. Nothing is decoded before the handshake (see ``auth``) succeeds; a
bad handshake, oversized frame or malformed header closes only this connection, with a logged
reason.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Optional

from monarch._src.transport import auth
from monarch._src.wire.frame import (
    BODY_LENGTHS,
    MAX_HEADER_BYTES,
    PREFIX,
    PREFIX_SIZE,
    FrameError,
    FrameTooLargeError,
    decode_header,
)

logger = logging.getLogger("monarch.transport")

SCRATCH_BYTES = 256 * 1024
#: A body at least this large is read directly into its own buffer.
DIRECT_READ_BYTES = 64 * 1024
#: An unauthenticated peer is dropped after this long (defends the listener).
SERVER_HANDSHAKE_TIMEOUT_S = 10.0
#: Connecting to a process that is still starting (its socket is bound before its interpreter
#: runs) can take long on a loaded machine; a process that dies is reported by its spawner.
CLIENT_HANDSHAKE_TIMEOUT_S = 120.0

FrameHandler = Callable[[dict, list], None]

# Reader states.
_AUTH = 0
_PREFIX = 1
_HEADER = 2
_BODY = 3


class FramedConnection(asyncio.BufferedProtocol):
    """One side of a connection. ``is_server`` selects the handshake role."""

    def __init__(
        self,
        *,
        is_server: bool,
        secret: bytes,
        max_frame_bytes: int,
        on_frame: FrameHandler,
        on_close: Callable[["FramedConnection", Optional[BaseException]], None] | None = None,
        on_ready: Callable[["FramedConnection"], None] | None = None,
        name: str = "",
    ) -> None:
        self.is_server = is_server
        self.name = name
        self._secret = secret
        self._max_frame = max_frame_bytes
        self._on_frame = on_frame
        self._on_close = on_close
        self._on_ready = on_ready
        self.transport: asyncio.Transport | None = None
        self.authenticated = False
        self.closed = False
        self.close_reason: BaseException | None = None
        self._pending: list[Any] = []
        self._buf = bytearray(SCRATCH_BYTES)
        self._start = 0
        self._end = 0
        self._target: bytearray | None = None
        self._target_pos = 0
        self._state = _AUTH
        self._need = auth.CLIENT_PROOF_BYTES if is_server else auth.CHALLENGE_BYTES
        self._nonce_s = b""
        self._nonce_c = b""
        self._header: dict[str, Any] = {}
        self._lengths: list[int] = []
        self._bodies: list[Any] = []
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []

    # -- asyncio callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        timeout = SERVER_HANDSHAKE_TIMEOUT_S if self.is_server else CLIENT_HANDSHAKE_TIMEOUT_S
        self._handshake_timer = loop.call_later(timeout, self._handshake_timeout, timeout)
        if self.is_server:
            self._nonce_s = auth.new_nonce()
            self.transport.write(auth.challenge(self._nonce_s))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed(exc or ConnectionResetError(f"connection {self.name} closed by peer"))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            return memoryview(self._target)[self._target_pos :]
        if self._end == len(self._buf):
            self._compact()
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._target_pos += nbytes
            if self._target_pos < len(self._target):
                return
            body, self._target = self._target, None
            self._body_done(body)
        else:
            self._end += nbytes
        try:
            self._parse()
        except (FrameError, auth.HandshakeError) as e:
            self.abort(e)

    def eof_received(self) -> bool:
        return False

    # -- sending ----------------------------------------------------------------------------

    def send(self, buffers: list[Any]) -> None:
        """Queue a frame's buffers; called on the loop thread only."""
        if self.closed:
            raise ConnectionResetError(f"connection {self.name} is closed: {self.close_reason}")
        if self.authenticated:
            self.transport.writelines(buffers)  # type: ignore[union-attr]
        else:
            self._pending.extend(buffers)

    async def drain(self) -> None:
        if self._paused and not self.closed:
            fut = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(fut)
            await fut

    def abort(self, reason: BaseException) -> None:
        if not self.closed:
            logger.warning("closing connection %s: %s", self.name, reason)
        self._closed(reason)
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    # -- internals --------------------------------------------------------------------------

    def _closed(self, reason: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._pending = []
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self.resume_writing()
        if self._on_close is not None:
            self._on_close(self, reason)

    def _handshake_timeout(self, timeout: float) -> None:
        if not self.authenticated:
            self.abort(auth.HandshakeError(f"handshake not completed within {timeout}s"))

    def _compact(self) -> None:
        live = self._end - self._start
        if self._start:
            self._buf[:live] = self._buf[self._start : self._end]
            self._start, self._end = 0, live
        if self._end == len(self._buf):
            self._buf.extend(bytes(len(self._buf)))

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[self._start : self._start + n])
        self._start += n
        if self._start == self._end:
            self._start = self._end = 0
        return data

    def _parse(self) -> None:
        while True:
            avail = self._end - self._start
            if self._state == _BODY:
                n = self._lengths[len(self._bodies)]
                if avail >= n:
                    self._body_done(self._take(n))
                    continue
                if n >= DIRECT_READ_BYTES:
                    target = bytearray(n)
                    target[:avail] = self._buf[self._start : self._end]
                    self._start = self._end = 0
                    self._target, self._target_pos = target, avail
                    return
                if n > len(self._buf) - self._start:
                    self._compact()
                return
            if avail < self._need:
                if self._need > len(self._buf) - self._start:
                    self._compact()
                    while self._need > len(self._buf):
                        self._buf.extend(bytes(len(self._buf)))
                return
            data = self._take(self._need)
            if self._state == _PREFIX:
                (hlen,) = PREFIX.unpack(data)
                if hlen > MAX_HEADER_BYTES:
                    raise FrameError(f"frame header of {hlen} bytes exceeds {MAX_HEADER_BYTES}")
                self._state, self._need = _HEADER, hlen
            elif self._state == _HEADER:
                header = decode_header(data)
                lengths = header[BODY_LENGTHS]
                total = len(data) + sum(lengths)
                if total > self._max_frame:
                    raise FrameTooLargeError(total, self._max_frame, "receiving")
                self._header, self._lengths, self._bodies = header, lengths, []
                if lengths:
                    self._state = _BODY
                else:
                    self._frame_done()
            else:
                self._auth_step(data)

    def _body_done(self, body: Any) -> None:
        self._bodies.append(body)
        if len(self._bodies) == len(self._lengths):
            self._frame_done()

    def _frame_done(self) -> None:
        header, bodies = self._header, self._bodies
        self._state, self._need = _PREFIX, PREFIX_SIZE
        self._header, self._bodies = {}, []
        self._on_frame(header, bodies)

    def _auth_step(self, data: bytes) -> None:
        if self.is_server:
            if not self._nonce_c:
                self._nonce_c = auth.check_client_proof(self._secret, self._nonce_s, data)
                self.transport.write(auth.server_proof(self._secret, self._nonce_c, self._nonce_s))  # type: ignore[union-attr]
                self._authenticated()
        elif not self._nonce_s:
            self._nonce_s = auth.parse_challenge(data)
            self._nonce_c = auth.new_nonce()
            self.transport.write(auth.client_proof(self._secret, self._nonce_s, self._nonce_c))  # type: ignore[union-attr]
            self._need = auth.SERVER_PROOF_BYTES
        else:
            auth.check_server_proof(self._secret, self._nonce_c, self._nonce_s, data)
            self._authenticated()

    def _authenticated(self) -> None:
        self.authenticated = True
        self._state, self._need = _PREFIX, PREFIX_SIZE
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._pending:
            pending, self._pending = self._pending, []
            self.transport.writelines(pending)  # type: ignore[union-attr]
        if self._on_ready is not None:
            self._on_ready(self)
