"""The receiving side of a connection: authenticates the peer, then decodes its frames.

An asyncio ``BufferedProtocol`` (the sending side is ``outgoing``; each process sends to a peer
on a connection of its own and receives on the peer's).

Reading uses a scratch buffer for small data and hands the event loop the frame body's final
buffer for large bodies, so a 64 MiB array is read from the socket straight into the memory the
unpickled object will use. That buffer grows as the bytes arrive (``ALLOC_AHEAD_BYTES`` at
first, then doubling), so a header that claims a huge body costs nothing until the body comes.

Nothing is decoded before the handshake (see ``auth``) succeeds, and until then the connection
holds only a few bytes of buffer. A bad handshake or malformed header closes only this
connection, with a logged reason. A well-formed frame this process cannot take (over the size
limit, or no memory for its body) is skipped, and its header handed to ``on_reject``, so its
sender hears why; the connection stays usable.

The only bytes it writes back after the handshake are the counts of frames read
(``read_count``), which let the sender keep only what it may have to send again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, cast

from monarch._src.transport import auth, read_count, tls
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

#: The read buffer of an authenticated connection, as it starts (it doubles when a read fills
#: it): one read takes a burst of small frames at once.
SCRATCH_BYTES = 256 * 1024
#: The same for a connection that carries replies to one thread or event loop only (a reply
#: address's: ``loop_replies``), one per worker replying there: small frames one at a time.
REPLY_SCRATCH_BYTES = 16 * 1024
#: A body at least this large is read directly into its own buffer.
DIRECT_READ_BYTES = 64 * 1024
#: A large body's buffer is first allocated this large (or the body's size, if smaller); it
#: doubles when full, so memory follows the bytes that actually arrived.
ALLOC_AHEAD_BYTES = 16 << 20
#: An unauthenticated peer is dropped after this long (defends the listener).
HANDSHAKE_TIMEOUT_S = 10.0

FrameHandler = Callable[[dict, list], None]
#: Told the header of a frame that was not delivered, and why.
RejectHandler = Callable[[dict, BaseException], None]

# Reader states.
_AUTH = 0
_PREFIX = 1
_HEADER = 2
_BODY = 3
_SKIP = 4


class IncomingConnection(asyncio.BufferedProtocol):
    """A connection accepted by this process's listener."""

    def __init__(
        self,
        *,
        secret: bytes,
        max_frame_bytes: int,
        on_frame: FrameHandler,
        on_reject: RejectHandler,
        on_close: Callable[[IncomingConnection, BaseException | None], None] | None = None,
        name: str = "",
        local_address: str = "",
        on_read_done: Callable[[], None] | None = None,
        defer_cut_off: bool = False,
        scratch_bytes: int = SCRATCH_BYTES,
    ) -> None:
        """``on_read_done``: told after the frames of each read from the socket were handed to
        ``on_frame``, so that work they call for can be done once per read. ``defer_cut_off``:
        a frame the connection's end cuts off is left in ``cut_off`` for the owner, who may
        learn that its sender sends it again, instead of handed to ``on_reject``.
        ``scratch_bytes``: its read buffer once the peer authenticated (it doubles when full)."""
        self.name = name
        #: The address of this process the peer connected to.
        self.local_address = local_address
        self._secret = secret
        self._max_frame = max_frame_bytes
        #: Told every decoded frame; its owner may replace it (e.g. after the first frame).
        self.on_frame = on_frame
        self._on_reject = on_reject
        self._on_close = on_close
        self._on_read_done = on_read_done
        self._defer_cut_off = defer_cut_off
        self._scratch_bytes = scratch_bytes
        #: The header of the frame the connection's end cut off, and the error that says so
        #: (with ``defer_cut_off``); not counted in ``frames_read``.
        self.cut_off: tuple[dict, BaseException] | None = None
        self.transport: asyncio.Transport | None = None
        self.authenticated = False
        self.closed = False
        self.close_reason: BaseException | None = None
        #: The address the peer listens at, as its first frame said (set by the owner).
        self.peer: str | None = None
        #: Frames decoded (handed to ``on_frame``) or rejected (handed to ``on_reject``): what
        #: the peer wrote and this side accounted for, compared with what it says it sent.
        self.frames_read = 0
        #: Bytes read from the socket (after the handshake's): they, and ``frames_read``, say
        #: when the next ``read_count.ACK`` is due (never, until ``start_acks``).
        self._bytes_read = 0
        self._ack_at_frame = self._ack_at_byte = 1 << 62
        #: Set by the owner when the peer's hello asks how many frames of the connection this
        #: one replaces were read; cleared once told (``tell_read``).
        self.read_count_due = False
        #: What the peer was told (``tell_read``; None: unknown, or not told): a later
        #: connection of the peer that asks the same question again is told the same.
        self.told: int | None = None
        #: The nonce the peer chose in the handshake (``auth``), which names this connection in
        #: its later hellos; and the one its own hello's question named (set by the owner).
        self.nonce: bytes | None = None
        self.asked_about: bytes | None = None
        #: The number of this connection's first frame among all those the peer sent to this
        #: process (its hello says; moved on past those the peer did not send again once told
        #: what was read, ``tell_read``): what it read of them all is told in those terms.
        self.first_index = 0
        # Just the client's proof until the peer is authenticated (see _auth_step).
        self._buf = bytearray(auth.CLIENT_PROOF_BYTES)
        self._start = 0
        self._end = 0
        self._target: bytearray | None = None
        self._target_pos = 0
        self._target_size = 0
        #: While skipping a rejected frame: bytes left to skip, and why it was rejected.
        self._skip = 0
        self._reject_reason: BaseException | None = None
        self._state = _AUTH
        self._need = auth.CLIENT_PROOF_BYTES
        self._nonce_s = b""
        self._header: dict[str, Any] = {}
        self._lengths: list[int] = []
        self._bodies: list[Any] = []
        self._handshake_timer: asyncio.TimerHandle | None = None
        #: Told once, when the peer authenticated or the connection closed before it did: the
        #: listener counts this connection among those in their handshake until then.
        self.on_handshake_over: Callable[[IncomingConnection], None] | None = None

    # -- asyncio callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server or connection always hands over a full Transport; the base
        # protocol signature only promises BaseTransport.
        self.transport = stream = cast("asyncio.Transport", transport)
        if self.closed:  # dropped (see listener) before its transport was made
            stream.abort()
            return
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(HANDSHAKE_TIMEOUT_S, self._handshake_timeout)
        self._nonce_s = auth.new_nonce()
        stream.write(auth.challenge(self._nonce_s))

    def connection_lost(self, exc: Exception | None) -> None:
        reason = exc or ConnectionResetError(f"connection {self.name} closed by peer")
        if self._state in (_BODY, _SKIP) and self._header:
            # The frame was cut off: its sender (if it still listens) hears of it.
            error = self._reject_reason or ConnectionResetError(
                f"the connection closed in the middle of this message ({reason})"
            )
            if self._defer_cut_off:
                self.cut_off = (self._header, error)
            else:
                self._reject(error)
        self._closed(reason)

    def get_buffer(self, sizehint: int) -> memoryview:
        target = self._target
        if target is not None:
            if self._target_pos == len(target):
                # Grown here, before the read: nothing else holds a view of it now.
                try:
                    target.extend(bytes(min(self._target_size, 2 * len(target)) - len(target)))
                except MemoryError:
                    self._target = None
                    self._skip_rest_of_frame(self._out_of_memory(), self._target_size - self._target_pos)
                    return self.get_buffer(sizehint)
            return memoryview(target)[self._target_pos :]
        if self._end == len(self._buf):
            self._compact()
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._bytes_read += nbytes
        if self._target is not None:
            self._target_pos += nbytes
            if self._target_pos < self._target_size:
                return
            body, self._target = self._target, None
            self._body_done(body)
        else:
            self._end += nbytes
        try:
            self._parse()
        except (FrameError, auth.HandshakeError) as e:
            self.abort(e)
        finally:
            if self.frames_read >= self._ack_at_frame or self._bytes_read >= self._ack_at_byte:
                self._ack()
            if self._on_read_done is not None:
                self._on_read_done()

    def swap_routing(
        self, routing: tuple[FrameHandler, RejectHandler, Callable[[], None] | None]
    ) -> tuple[FrameHandler, RejectHandler, Callable[[], None] | None]:
        """Where frames, rejected frames and the end of each read go from now on (``routing``:
        ``on_frame``, ``on_reject``, ``on_read_done``); returns where they went."""
        before = (self.on_frame, self._on_reject, self._on_read_done)
        self.on_frame, self._on_reject, self._on_read_done = routing
        return before

    # -- telling the sender what was read (see ``read_count``) --------------------------------

    def start_acks(self) -> None:
        """(once the peer's hello was read) Acknowledge the frames read from now on, so that the
        peer keeps only those it may have to send again."""
        self._ack_at_frame = self.frames_read + read_count.ACK_FRAMES
        self._ack_at_byte = self._bytes_read + read_count.ACK_BYTES

    def _ack(self) -> None:
        self.start_acks()  # the next one is due an interval from now
        self._write_back(read_count.ACK, self.frames_read - 1)  # its hello is not counted

    def tell_read(self, count: int | None) -> None:
        """Tell the peer how many of the frames it sent were read (``read_upto`` of its previous
        connection; None: unknown), if its hello asked (``read_count_due``); once. The peer
        sends again those after them that it kept, which this connection's frames are from
        then on numbered from."""
        if self.read_count_due:
            self.read_count_due = False
            self.told = count
            if count is not None:
                self.first_index = max(self.first_index, count)
            self._write_back(read_count.PREVIOUS, read_count.UNKNOWN if count is None else count)

    def read_upto(self, read: int) -> int | None:
        """How many frames the peer sent, on every connection, were read when ``read`` of this
        connection's were; None while its hello's question is unanswered (how many of those
        before it were read is then known only by the connection it replaced, if any)."""
        return None if self.read_count_due else self.first_index + read

    def _write_back(self, kind: bytes, count: int) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(read_count.RECORD.pack(kind, count))

    def eof_received(self) -> bool:
        return False

    def abort(self, reason: BaseException, log: bool = True) -> None:
        if not self.closed and log:
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
        self._handshake_over()
        if self._on_close is not None:
            self._on_close(self, reason)

    def _handshake_over(self) -> None:
        told, self.on_handshake_over = self.on_handshake_over, None
        if told is not None:
            told(self)

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
                    size = sum(lengths)
                    if hend + size <= end and hlen + size <= self._max_frame:
                        bodies = []
                        pos = hend
                        for n in lengths:
                            bodies.append(buf[pos : pos + n])
                            pos += n
                        if pos == end:
                            self._start = self._end = 0
                        else:
                            self._start = pos
                        self.frames_read += 1
                        self.on_frame(header, bodies)
                        continue
            if self._state == _BODY:
                n = self._lengths[len(self._bodies)]
                if avail >= n:
                    self._body_done(self._take(n))
                    continue
                if n >= DIRECT_READ_BYTES:
                    try:
                        target = bytearray(min(n, max(ALLOC_AHEAD_BYTES, avail)))
                    except MemoryError:
                        self._skip_rest_of_frame(self._out_of_memory(), n)
                        continue
                    target[:avail] = self._buf[self._start : self._end]
                    self._start = self._end = 0
                    self._target, self._target_pos, self._target_size = target, avail, n
                    return
                if n > len(self._buf) - self._start:
                    self._compact()
                return
            if self._state == _SKIP:
                n = min(avail, self._skip)
                self._skip -= n
                self._start += n
                if self._start == self._end:
                    self._start = self._end = 0
                if self._skip:
                    return
                self._state, self._need = _PREFIX, PREFIX_SIZE
                self._reject(self._reject_reason)  # type: ignore[arg-type]
                continue
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
                self._header, self._lengths, self._bodies = header, lengths, []
                if total > self._max_frame:
                    self._skip_rest_of_frame(FrameTooLargeError(total, self._max_frame, "receiving"), 0)
                elif lengths:
                    self._state = _BODY
                else:
                    self._frame_done()
            else:
                self._auth_step(data)
                buf = self._buf  # the full-size buffer it put in place

    def _skip_rest_of_frame(self, reason: BaseException, skip_of_this_body: int) -> None:
        """Drop the frame being read (its header is known): skip what is left of its current
        body (``skip_of_this_body``) and of the bodies after it, then reject it."""
        later = self._lengths[len(self._bodies) + (1 if skip_of_this_body else 0) :]
        self._bodies = []
        self._skip = skip_of_this_body + sum(later)
        self._reject_reason = reason
        self._state = _SKIP
        logger.warning("skipping a message on connection %s: %s", self.name, str(reason).split("\n", 1)[0])

    def _out_of_memory(self) -> MemoryError:
        size = sum(self._lengths)
        return MemoryError(
            f"the receiving process (pid {os.getpid()}) ran out of memory for a {size}-byte "
            "message; the message was dropped\n"
            "HINT: send large data in smaller pieces, or give the receiving process more memory."
        )

    def _reject(self, reason: BaseException) -> None:
        header = self._header
        self._header, self._bodies, self._reject_reason = {}, [], None
        self.frames_read += 1
        try:
            self._on_reject(header, reason)
        except Exception:
            logger.exception("reporting a rejected message failed")

    def _body_done(self, body: Any) -> None:
        self._bodies.append(body)
        if len(self._bodies) == len(self._lengths):
            self._frame_done()

    def _frame_done(self) -> None:
        header, bodies = self._header, self._bodies
        self._state, self._need = _PREFIX, PREFIX_SIZE
        self._header, self._bodies = {}, []
        self.frames_read += 1
        self.on_frame(header, bodies)

    def _auth_step(self, data: bytes) -> None:
        try:
            nonce_c = auth.check_client_proof(self._secret, self._nonce_s, data)
        except auth.HandshakeError:
            if data[0] == tls.HANDSHAKE_RECORD:  # the client's first bytes were a ClientHello
                raise auth.HandshakeError(
                    "a client started a TLS handshake, but this process listens without TLS: "
                    f"TLS is configured on one side only\n{tls.HINT}"
                ) from None
            raise
        self.transport.write(auth.server_proof(self._secret, nonce_c, self._nonce_s))  # type: ignore[union-attr]
        self.authenticated = True
        self.nonce = nonce_c
        self._handshake_over()
        self._state, self._need = _PREFIX, PREFIX_SIZE
        # Only now is the peer worth a full-size buffer.
        early = self._buf[self._start : self._end]
        self._buf = bytearray(self._scratch_bytes)
        self._buf[: len(early)] = early
        self._start, self._end = 0, len(early)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
