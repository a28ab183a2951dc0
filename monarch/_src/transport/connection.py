"""The receiving side of a connection: authenticates the peer, then decodes its frames.

An asyncio ``BufferedProtocol`` (the sending side is ``outgoing``; each process sends to a peer
on a connection of its own and receives on the peer's).

Reading uses a scratch buffer for small data and hands the event loop the frame body's final
buffer for large bodies, so a 64 MiB array is read from the socket straight into the memory the
unpickled object will use. Nothing is decoded before the handshake (see ``auth``) succeeds; a
bad handshake, oversized frame or malformed header closes only this connection, with a logged
reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

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
HANDSHAKE_TIMEOUT_S = 10.0

FrameHandler = Callable[[dict, list], None]

# Reader states.
_AUTH = 0
_PREFIX = 1
_HEADER = 2
_BODY = 3


class IncomingConnection(asyncio.BufferedProtocol):
    """A connection accepted by this process's listener."""

    def __init__(
        self,
        *,
        secret: bytes,
        max_frame_bytes: int,
        on_frame: FrameHandler,
        on_close: Callable[[IncomingConnection, BaseException | None], None] | None = None,
        name: str = "",
    ) -> None:
        self.name = name
        self._secret = secret
        self._max_frame = max_frame_bytes
        self._on_frame = on_frame
        self._on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.authenticated = False
        self.closed = False
        self.close_reason: BaseException | None = None
        self._buf = bytearray(SCRATCH_BYTES)
        self._start = 0
        self._end = 0
        self._target: bytearray | None = None
        self._target_pos = 0
        self._state = _AUTH
        self._need = auth.CLIENT_PROOF_BYTES
        self._nonce_s = b""
        self._header: dict[str, Any] = {}
        self._lengths: list[int] = []
        self._bodies: list[Any] = []
        self._handshake_timer: asyncio.TimerHandle | None = None

    # -- asyncio callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server or connection always hands over a full Transport; the base
        # protocol signature only promises BaseTransport.
        self.transport = stream = cast("asyncio.Transport", transport)
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)
        self._nonce_s = auth.new_nonce()
        stream.write(auth.challenge(self._nonce_s))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed(exc or ConnectionResetError(f"connection {self.name} closed by peer"))

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
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._on_close is not None:
            self._on_close(self, reason)

    def _handshake_timeout(self) -> None:
        if not self.authenticated:
            self.abort(auth.HandshakeError(f"handshake not completed within {HANDSHAKE_TIMEOUT_S}s"))

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
        buf = self._buf
        while True:
            start, end = self._start, self._end
            avail = end - start
            if self._state == _PREFIX and avail > PREFIX_SIZE:
                # Fast path: a whole small frame is in the scratch buffer (the common case).
                (hlen,) = PREFIX.unpack_from(buf, start)
                hend = start + PREFIX_SIZE + hlen
                if hlen <= MAX_HEADER_BYTES and hend <= end:
                    header = decode_header(buf[start + PREFIX_SIZE : hend])
                    lengths = header[BODY_LENGTHS]
                    if hend + sum(lengths) <= end:
                        if hlen + sum(lengths) > self._max_frame:
                            raise FrameTooLargeError(hlen + sum(lengths), self._max_frame, "receiving")
                        bodies = []
                        pos = hend
                        for n in lengths:
                            bodies.append(buf[pos : pos + n])
                            pos += n
                        if pos == end:
                            self._start = self._end = 0
                        else:
                            self._start = pos
                        self._on_frame(header, bodies)
                        continue
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
        nonce_c = auth.check_client_proof(self._secret, self._nonce_s, data)
        self.transport.write(auth.server_proof(self._secret, nonce_c, self._nonce_s))  # type: ignore[union-attr]
        self.authenticated = True
        self._state, self._need = _PREFIX, PREFIX_SIZE
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
