"""The sending side of a connection, writable from any thread without a hop to the loop.

A thread that sends (the client's main thread, a sync actor's thread, the loop itself) takes a
lock and writes the frame straight to the non-blocking socket; only what the kernel does not
take at once is queued for the event loop to flush. One socket and one FIFO per peer keep
Monarch's per-sender ordering, and skipping the thread hop roughly halves the latency of a
blocking call. The loop thread runs the client half of the handshake (``auth``); frames sent
before it completes wait in the queue.

The peer is a Unix socket or a TCP one (``address``; Nagle's algorithm off). Under TLS (``tls``)
the socket is an ``ssl.SSLSocket`` that encrypts in the writing thread: the TLS handshake comes
first, and a failed one is final (``TlsError``: certificates do not change by retrying). So is
TLS on one side only, which either side tells at once: a plain listener answers a ClientHello
with its plaintext challenge, and a TLS listener answers a plaintext client's nonce with
``auth.TLS_ONLY``. A TLS 1.3 server checks the client's certificate after the client finished
its handshake, and refuses one by hanging up (no alert reaches the client): a peer that does so
``TLS_HANGUPS_BEFORE_FAILING`` times in a row, each right after the TLS handshake, has refused
this process's certificate.

A peer that cannot be reached yet (its listener's backlog is full, it is out of descriptors,
this process is) is retried with backoff, its frames kept in order, for up to
``unreachable_timeout_s``; only a peer nobody listens for any more (its process is gone) fails
at once. Either way the connection then closes with a reason (``PeerGoneError``,
``PeerUnreachableError``) that tells its owner what happened.

A connection that fails keeps the frames it never wholly handed to the kernel (``take_held``):
corked, queued behind a full socket buffer, queued before the handshake, or cut in the middle
by the failure (a frame written in part is kept whole). The peer cannot have read any of them,
as a frame is read only once its last byte arrives. It also keeps those it wrote until the peer
says it read them (``read_count``: an acknowledgement every few hundred frames), within bounds
(``keep``): a reset discards what the kernels hold, which the peer never reads. After the
handshake, its owner sends them on the connection that replaces it (``take_unread``), whose
greeting asks the peer how many of the written ones it read: only the others go again, first,
in their order, then the held ones, then any newer frame. Of those it no longer kept, it
counts how many the peer did not read (``unread_lost``) and, from a bounded record of where
the frames it forgot unread were going (``UNKEPT_RUNS`` runs; acknowledgements prune it), how
many went to each destination (``lost``), for its owner to report. Before it (the peer is
gone or unreachable), its owner reports the held ones. Kept frames are the queue's own
buffers, never copies; the cost on the send path is an append or two per frame, and a few
operations per write of the queue (the record of a frame forgotten unread costs the decoding
of its header, paid only beyond ``keep``).

A write that wakes a sleeping peer costs tens of microseconds of CPU, so a thread sending a
burst (frames less than ``BURST_GAP_S`` apart) corks: its frames queue up and go out in one
write when ``CORK_BUFFERS`` are queued, when the thread is about to block (``flush_corked``,
called by every blocking wait of the runtime), or when the loop gets to it, whichever is first.
A lone frame still goes out at once.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from monarch._src.transport import auth, read_count
from monarch._src.transport.address import TcpAddress, parse
from monarch._src.transport.cork import note_corked
from monarch._src.transport.tls import HINT as TLS_HINT

logger = logging.getLogger("monarch.transport")

#: First and longest pause between two attempts to reach a peer that is alive but unreachable.
RETRY_FIRST_S = 0.01
RETRY_MAX_S = 1.0
#: At most this many buffers per sendmsg call (the kernel's IOV_MAX is 1024).
MAX_IOV = 512
#: Frames sent closer together than this on one connection form a burst, which is corked.
BURST_GAP_S = 50e-6
#: A corked burst is written once this many buffers are queued (one per small frame, see
#: ``frame.JOIN_BYTES``; three or more per large one).
CORK_BUFFERS = 192
#: How many tagged frames a connection remembers (``sent_tags``): after it dropped, its owner
#: tells the peer which of them it had written, so that the peer knows which ones it lost.
TAG_RECORD = 1024
#: How many runs of frames it forgot unread (beyond ``keep``) a connection records the
#: destinations of (``lost``); beyond, the oldest are counted in one run whose destinations
#: are not recorded (the older a frame, the likelier the peer read it).
UNKEPT_RUNS = 64
#: The destination of the frames of that run (``lost``).
UNRECORDED = "?"
#: While a thread is still corking, the loop leaves the writing to it and looks again this much
#: later (writing from two threads at once makes each wait on the other's lock).
CORK_RECHECK_S = 1e-3
#: A TLS peer that hangs up this many times in a row right after the TLS handshake, before its
#: challenge, refuses this process's certificate (once could be a listener dropping the oldest
#: of too many pending handshakes).
TLS_HANGUPS_BEFORE_FAILING = 3


class PeerGoneError(ConnectionRefusedError):
    """Nobody listens at the peer's address any more: its process exited (or shut down)."""


class PeerUnreachableError(ConnectionError):
    """The peer could not be reached (or did not answer the handshake) within the bound."""


class TlsError(PeerUnreachableError):
    """The TLS handshake with the peer failed (a certificate missing, expired or not trusted):
    it stays unreachable, so it is reported at once rather than retried."""


def _nbytes(buffer: Any) -> int:
    return len(buffer) if type(buffer) is bytes else memoryview(buffer).nbytes


def _frame_bytes(frame: list[Any]) -> int:
    head = frame[0]
    if len(frame) == 1 and type(head) is bytes:  # most frames: small ones are joined (``frame``)
        return len(head)
    return sum(map(_nbytes, frame))


def _runs_from(runs: list[list[Any]], number: int) -> list[list[Any]]:
    """``runs`` (``[first frame number, count, destination]``) without their frames before
    frame ``number``."""
    kept = []
    for first, count, where in runs:
        if first + count > number:
            skip = max(number - first, 0)
            kept.append([first + skip, count - skip, where])
    return kept


def _by_destination(runs: list[list[Any]]) -> dict[Any, int]:
    """How many frames of ``runs`` went to each destination."""
    counts: dict[Any, int] = {}
    for _, count, where in runs:
        counts[where] = counts.get(where, 0) + count
    return counts


class Kept(NamedTuple):
    """What a closed connection hands to the one replacing it (``take_unread``)."""

    #: Frames (lists of buffers), oldest first: those it wrote and kept, then those it never
    #: wholly wrote.
    frames: list[list[Any]]
    #: ``(index among frames, tag)`` of the tagged ones.
    tags: list[tuple[int, Any]]
    #: The index, on the closed connection, of the first frame; None when it wrote none of them
    #: (then ``written`` is 0, and the peer need not be asked what it read).
    written_from: int | None
    #: How many of the first frames it, or a connection it replaced, had written.
    written: int
    #: The number of the first frame among all those sent to the peer (``first_index``).
    first_index: int
    #: ``[first frame number, count, destination]`` of the runs of frames forgotten before the
    #: peer said it read them (``lost``).
    unkept: tuple[list[Any], ...] = ()


class OutgoingConnection:
    """Frames to one peer address; ``send`` is thread-safe and never blocks."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        address: str,
        secret: bytes,
        on_close: Callable[[OutgoingConnection, BaseException], None],
        name: str,
        loop_ident: int | None,
        unreachable_timeout_s: float,
        tls: ssl.SSLContext | None = None,
        greeting: list[Any] | None = None,
        resend: Kept | None = None,
        keep: tuple[int, int] = (0, 0),
        first_index: int = 0,
        destination: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        """``greeting``: the buffers of a frame that goes first (it is not in ``frames_sent``);
        ``resend``: frames kept by the connection this one replaces, their tags, and the index
        there of the first (``take_unread``), which go next, as this connection's first frames.
        If that index is not None, the first of them were written there, and only those the peer
        did not read are sent (it says which in answer to the greeting, ``read_count``): until
        then only the greeting goes out. ``keep``: how many frames, and bytes, it keeps after
        writing them until the peer says it read them (the oldest are forgotten beyond either):
        more than both kernels' socket buffers and an acknowledgement's interval hold, so that
        only a peer that reads nothing for long makes it forget frames it may have to resend.
        ``first_index``: the number of its first frame, when it resends none (else the resent
        frames' own). ``destination``: what its owner is to report a frame lost to (None: its
        loss is reported otherwise), asked of each frame forgotten unread (``lost``)."""
        self._loop = loop
        self._loop_ident = loop_ident
        self._address = parse(address)
        #: TLS for a TCP peer when configured; None: the socket carries plaintext.
        self._tls = tls if isinstance(self._address, TcpAddress) else None
        self._tls_done = False
        #: Consecutive attempts the TLS peer hung up on right after the TLS handshake.
        self._tls_hangups = 0
        self._secret = secret
        self._on_close = on_close
        #: Run (on the loop thread) once the handshake completes.
        self.when_authenticated: list[Callable[[], None]] = []
        #: While ``when_authenticated`` runs: the frames sent on it until then (none written).
        self.queued_at_handshake: list[list[Any]] = []
        #: Of the frames the connection it replaces wrote, how many the peer did not read and
        #: this one does not send again (forgotten: see ``keep``); None if the peer could
        #: not tell. Set before ``when_authenticated`` runs.
        self.unread_lost: int | None = 0
        #: How many of those frames went to each destination (``UNRECORDED``: beyond the record),
        #: or of those it does not send again and the peer may not have read (``unread_lost``
        #: None); set with ``unread_lost``.
        self.lost: dict[Any, int] = {}
        self._destination = destination
        self._unreachable_timeout_s = unreachable_timeout_s
        self._retry_delay = RETRY_FIRST_S
        self._last_error: BaseException | None = None
        self.name = name
        self._lock = threading.Lock()
        self._queue: collections.deque[Any] = collections.deque(greeting or ())  # buffers, as sent
        #: Frames sent before it is writable (``_writable``: authenticated, and the peer told
        #: what it read of the previous connection when asked), oldest first.
        resend = resend or Kept([], [], None, 0, first_index)
        #: The number of its first frame among all those sent to the peer, on every connection:
        #: the peer answers the greeting with the number of frames it read of them all
        #: (``read_count``), which a drop of this connection before that answer arrived does not
        #: make stale, as a count of one connection's frames would be.
        self.first_index = resend.first_index
        self._waiting: collections.deque[list[Any]] = collections.deque(resend.frames)
        self._writable = False
        #: What the connection this one replaces wrote and kept (``Kept``): the peer is asked
        #: which of those it read.
        self._resend_from, self._resend_written = resend.written_from, resend.written
        #: (its owner's) What its greeting asked the peer: asked again by the connection that
        #: replaces it if it closes ``unanswered``.
        self.question: Any = None
        #: Written frames kept for a resend, the first of them frame ``_retained_from`` (all
        #: before it were read, or forgotten), until the peer read them; and their bytes (and
        #: those of the frame being written, counted as they are written).
        self._retained: collections.deque[list[Any]] = collections.deque()
        self._retained_from = 0
        self._retained_bytes = 0
        self._keep_frames, self._keep_bytes = keep
        #: Runs of frames forgotten before the peer said it read them, ``[first frame number
        #: (as ``first_index``), count, destination]``, oldest first, at most ``UNKEPT_RUNS``:
        #: the frames are gone, but where they were going is reported if they were lost.
        self._unkept = [list(run) for run in resend.unkept]
        #: The frames (their lists of buffers, as sent) with buffers in ``_queue``, oldest first
        #: (the queue holds their buffers but the oldest one's first ``_head_written``), so that
        #: a failure can tell which frames were never wholly written. Trimmed after writes.
        self._greeting = greeting
        self._frames: collections.deque[list[Any]] = collections.deque([greeting] if greeting else ())
        self._head_written = 0
        #: After a failure: the frames never wholly handed to the kernel (see ``take_held``).
        self._held: list[list[Any]] = []
        self._sock: socket.socket | None = None  # an ssl.SSLSocket under TLS
        self._writer_registered = False
        self._flush_scheduled = False
        self._last_direct_send = 0.0
        self._last_corked = 0.0
        #: The thread that noted this connection in its corked list last (``note_corked``) and
        #: has not written it since: its further frames need not note it again.
        self._noted_by: int | None = None
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.authenticated = False
        self.closed = False
        #: Frames handed to ``send`` (what a test or benchmark counts per peer), or resent.
        self.frames_sent = len(resend.frames)
        #: ``(frame index, tag)`` of the latest frames sent with a tag (see ``sent_tags``).
        self._tags: collections.deque[tuple[int, Any]] = collections.deque(resend.tags, maxlen=TAG_RECORD)
        #: Set once held frames' tags left ``_tags`` (``take_held``): from where it is complete.
        self._tags_known_from: int | None = None
        self.close_reason: BaseException | None = None
        self._handshake = bytearray()
        self._nonce_c = b""
        self._nonce_s = b""
        self._timer: asyncio.TimerHandle | None = None
        #: A TCP connect in flight.
        self._connecting: asyncio.Future[None] | None = None

    # -- sending (any thread) ---------------------------------------------------------------

    def send(self, buffers: list[Any], tag: Any = None) -> None:
        """Send one frame; ``tag`` (the owner's, e.g. the port a reply goes to) is remembered,
        so that after the connection closed the owner can tell the peer which of its frames
        went out on it (``sent_tags``)."""
        with self._lock:
            if self.closed:
                raise ConnectionResetError(f"connection {self.name} is closed: {self.close_reason}")
            if tag is not None:
                self._tags.append((self.frames_sent, tag))
            self.frames_sent += 1
            if not self._writable:  # the handshake's end (``_open``) queues it
                self._waiting.append(buffers)
                return
            q = self._queue
            ident = threading.get_ident()
            on_loop = ident == self._loop_ident
            if q or self._flush_scheduled:
                q.extend(buffers)
                self._frames.append(buffers)
                if not on_loop:
                    self._last_corked = time.monotonic()
                    if len(q) >= CORK_BUFFERS:
                        self._write_queued()
                    elif self._noted_by != ident:
                        self._noted_by = ident
                        note_corked(self)
                return
            now = time.monotonic()
            if now - self._last_direct_send < BURST_GAP_S:
                q.extend(buffers)
                self._frames.append(buffers)
                self._flush_scheduled = True
                if on_loop:  # the rest of the loop's burst goes out in one write, next iteration
                    self._loop.call_soon(self._flush)
                    return
                self._last_corked = now
                self._loop.call_soon_threadsafe(self._flush)
                self._noted_by = ident
                note_corked(self)
                return
            self._last_direct_send = now
            call_soon = self._loop.call_soon if on_loop else self._loop.call_soon_threadsafe
            try:
                sent = self._sock.sendmsg(buffers)  # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as e:  # the frame is held (see take_held)
                q.extend(buffers)
                self._frames.append(buffers)
                call_soon(self._fail, e)
                return
            size = sent
            for b in buffers:  # what the kernel did not take is queued
                n = len(b) if type(b) is bytes else memoryview(b).nbytes  # (``_nbytes``, inline)
                if sent >= n:
                    sent -= n
                    continue
                q.append(memoryview(b).cast("B")[sent:] if sent else b)
                sent = 0
            self._retained_bytes += size
            if q:
                self._frames.append(buffers)
                self._head_written = len(buffers) - len(q)  # the queue was empty
                self._flush_scheduled = True
                call_soon(self._flush)
                return
            retained = self._retained  # written whole: kept until the peer read it
            retained.append(buffers)
            if len(retained) > self._keep_frames or self._retained_bytes > self._keep_bytes:
                self._forget(0)

    def _write_queued(self) -> bool:
        """Write queued buffers until the kernel is full (lock held); False if the socket failed.

        Whatever stays queued is the loop's to write: a ``_flush`` is scheduled or the writer
        is registered whenever the queue is not empty.
        """
        q = self._queue
        popped = total = 0
        failed: OSError | None = None
        while q:
            batch = [q[i] for i in range(min(len(q), MAX_IOV))]
            try:
                sent = self._sock.sendmsg(batch)  # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:  # what is still queued is held (``_hold_unwritten``)
                failed = e
                break
            total += sent
            while q and _nbytes(q[0]) <= sent:  # empty buffers (b"" bodies) go here too
                sent -= _nbytes(q.popleft())
                popped += 1
            if sent:
                q[0] = memoryview(q[0]).cast("B")[sent:]
        frames = self._frames
        retained = self._retained  # the frames wholly written move there
        if not q:
            retained.extend(frames)
            frames.clear()
            self._head_written = 0
        elif popped:
            written = self._head_written + popped
            while frames and len(frames[0]) <= written:
                written -= len(frame := frames.popleft())
                retained.append(frame)
            self._head_written = written
        self._retained_bytes += total
        if self._greeting is not None and retained and retained[0] is self._greeting:
            retained.popleft()  # not counted: a new connection has its own
            self._retained_bytes -= _frame_bytes(self._greeting)
            self._greeting = None
        if len(retained) > self._keep_frames or self._retained_bytes > self._keep_bytes:
            self._forget(0)
        if failed is not None:
            self._loop.call_soon_threadsafe(self._fail, failed)
            return False
        return True

    def _forget(self, read: int) -> None:
        """(lock held) Stop keeping the frames the peer read (the first ``read`` of this
        connection), and the oldest beyond the bounds (``keep``)."""
        retained = self._retained
        if read and self._unkept:
            self._unkept = _runs_from(self._unkept, self.first_index + read)
        while retained and (
            self._retained_from < read
            or len(retained) > self._keep_frames
            or self._retained_bytes > self._keep_bytes
        ):
            frame = retained.popleft()
            self._retained_bytes -= _frame_bytes(frame)
            if self._retained_from >= read:  # the peer may not have read it
                self._note_unkept(self.first_index + self._retained_from, frame)
            self._retained_from += 1

    def _note_unkept(self, number: int, frame: list[Any]) -> None:
        """(lock held) Record where frame ``number``, forgotten unread, was going."""
        runs = self._unkept
        where = self._destination(frame) if self._destination is not None else None
        if runs:
            last = runs[-1]
            if last[0] + last[1] == number and last[2] == where:
                last[1] += 1
                return
            if len(runs) == UNKEPT_RUNS:  # full: the oldest two (the likeliest read) merge
                oldest, second = runs[0], runs.pop(1)
                runs[0] = [oldest[0], second[0] + second[1] - oldest[0], UNRECORDED]
        runs.append([number, 1, where])

    def _hold_unwritten(self) -> None:
        """(lock held, closing) Keep the frames with a buffer still queued, whole, for
        ``take_held``: none of them reached the peer (the greeting is not kept: a new
        connection has its own)."""
        held = list(self._frames) if self._queue else []
        if held and held[0] is self._greeting:  # the new connection has its own
            del held[0]
        self._held = held + list(self._waiting)
        self._waiting.clear()
        self._frames.clear()
        self._queue.clear()

    def take_held(self) -> tuple[list[list[Any]], list[tuple[int, Any]]]:
        """Once closed: the frames (lists of buffers) it never wholly handed to the kernel, oldest
        first, and their tags as ``(index among them, tag)``; handed out once (then nothing).
        They were the last of ``frames_sent``: from then on ``frames_sent`` and ``sent_tags``
        count only the frames written on this connection, wholly or in part. Whoever takes
        them sends them on (``resend``), or reports them undelivered."""
        with self._lock:
            held, self._held = self._held, []
            base = self.frames_sent - len(held)
            tags = [(index - base, tag) for index, tag in self._tags if index >= base]
            self._tags_known_from = self._tags_complete_from()
            while self._tags and self._tags[-1][0] >= base:
                self._tags.pop()
            self.frames_sent = base
        return held, tags

    def take_unread(self) -> Kept:
        """Once closed: ``take_held``, with the frames it wrote and still keeps before them (the
        peer may not have read them: the connection replacing it asks, ``read_count``)."""
        held, tags = self.take_held()
        with self._lock:
            first = self._retained_from
            written = list(self._retained)
            self._retained.clear()
            self._retained_bytes = 0
            kept = [(index - first, tag) for index, tag in self._tags if first <= index < self.frames_sent]
            # Never writable: it wrote none, but what it was to send again may have been read.
            was_written = len(written) if self._writable else self._resend_written
            unkept = tuple(self._unkept)
            self._unkept = []
        kept += [(index + len(written), tag) for index, tag in tags]
        return Kept(written + held, kept, first, was_written, self.first_index + first, unkept)

    @property
    def nonce(self) -> bytes:
        """The nonce it chose in the handshake (once authenticated): the peer knows it too, so
        the next connection's greeting names this one by it."""
        return self._nonce_c

    @property
    def unanswered(self) -> bool:
        """Whether its greeting asked what the peer read (``resend``) and it closed before the
        answer came: it wrote nothing but the greeting, which the peer may never have read."""
        return self._resend_from is not None and not self._writable

    @property
    def written_before(self) -> int:
        """How many of the first frames ``take_held`` hands out the connection this one replaces
        had written (the peer may have read them): those it was to send again, had the peer
        not read them, if it never got to ask the peer."""
        return 0 if self._writable else self._resend_written

    def sent_tags(self) -> tuple[int, list[list[Any]]]:
        """``(known from, [[frame index, tag], ...])``: the tagged frames sent, complete from
        frame index ``known from`` on (the record is bounded, ``TAG_RECORD``)."""
        with self._lock:
            tags = [[index, tag] for index, tag in self._tags]
            known_from = (
                self._tags_known_from if self._tags_known_from is not None else self._tags_complete_from()
            )
        return known_from, tags

    def _tags_complete_from(self) -> int:
        """(lock held) The first frame index from which ``_tags`` misses no tag."""
        return self._tags[0][0] if len(self._tags) == TAG_RECORD else 0

    def write_corked(self) -> None:
        with self._lock:
            self._noted_by = None
            if self._queue and self.authenticated and not self.closed:
                self._write_queued()

    def _flush(self) -> None:
        """Write what is queued (loop thread); wait for writability if the kernel is full."""
        with self._lock:
            busy = time.monotonic() - self._last_corked
            if busy < CORK_RECHECK_S and self._queue and not self.closed and not self._writer_registered:
                self._loop.call_later(CORK_RECHECK_S - busy, self._flush)  # still scheduled
                return
            self._flush_scheduled = False
            if self.closed or not self.authenticated:
                return
            if not self._write_queued():
                return
            q = self._queue
            fd = self._sock.fileno()  # type: ignore[union-attr]
            if not q:
                self._wake_drain_waiters()
            if q and not self._writer_registered:
                self._writer_registered = True
                self._loop.add_writer(fd, self._flush)
            elif not q and self._writer_registered:
                self._writer_registered = False
                self._loop.remove_writer(fd)

    def _wake_drain_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def drained(self) -> None:
        """Wait until every queued frame was handed to the kernel (or the connection closed)."""
        with self._lock:
            if self.closed or (self._writable and not self._queue):
                return
            fut = self._loop.create_future()
            self._drain_waiters.append(fut)
        await fut

    # -- connecting and the handshake (loop thread) ----------------------------------------

    async def connect(self) -> None:
        """Connect and authenticate, retrying within the bound (see the module docstring)."""
        self._timer = self._loop.call_later(self._unreachable_timeout_s, self._unreachable)
        await self._attempt()

    async def _attempt(self) -> None:
        if self.closed:
            return
        target = self._address
        candidates: list[tuple[int, Any]]
        if isinstance(target, TcpAddress):
            try:
                infos = await self._loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
            except OSError as e:  # the name not resolved (yet): as transient as an unreachable peer
                self._retry(e)
                return
            candidates = [(info[0], info[4]) for info in infos]
        else:
            candidates = [(socket.AF_UNIX, target.path)]
        refused: OSError | None = None
        for family, sockaddr in candidates:  # a host name may resolve to several addresses
            if self.closed:
                return
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as e:  # out of descriptors here: as transient as the peer being busy
                self._retry(e)
                return
            sock.setblocking(False)
            self._sock = sock
            try:
                if family == socket.AF_UNIX:
                    # A Unix socket connects at once or fails at once (EAGAIN: the backlog is full).
                    sock.connect(sockaddr)
                else:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    # A SYN nobody answers (a cut link) waits minutes in the kernel: ended
                    # with the socket, by the unreachable bound (see _close_socket).
                    self._connecting = asyncio.ensure_future(self._loop.sock_connect(sock, sockaddr))
                    await self._connecting
            except (FileNotFoundError, ConnectionRefusedError) as e:
                refused = e
                self._close_socket()
                continue
            except OSError as e:  # a TCP peer not reached yet (no route, timed out): retried
                self._retry(e)
                return
            if self.closed or self._sock is not sock:
                return
            if self._tls is not None:
                self._sock = sock = self._tls.wrap_socket(sock, do_handshake_on_connect=False)
                self._tls_step()
            else:
                self._send_nonce()
            if self.closed or self._sock is not sock:  # failed: closed, or to be retried
                return
            self._loop.add_reader(sock.fileno(), self._readable)
            return
        # Listening sockets are bound before their process starts: a refusal means the process
        # is gone (its host may be up, but nothing listens on its port).
        self._fail(PeerGoneError(f"nobody listens at {self.name} any more ({refused})"))

    def _tls_step(self) -> None:
        """(loop thread) Drive the TLS handshake; the HMAC handshake then runs inside TLS."""
        sock = self._sock
        if sock is None:
            return
        try:
            sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            return  # _readable steps again
        except ssl.SSLWantWriteError:
            self._loop.add_writer(sock.fileno(), self._tls_writable)
            return
        except ssl.SSLError as e:
            if e.reason == "WRONG_VERSION_NUMBER":  # what OpenSSL makes of a plaintext answer
                why = "it answered in plaintext: TLS is configured on this side only"
            else:
                why = str(e)
            self._fail(TlsError(f"TLS handshake with {self.name} failed: {why}\n{TLS_HINT}"))
            return
        except OSError as e:
            self._lost(e)
            return
        self._tls_done = True
        self._send_nonce()

    def _send_nonce(self) -> None:
        """Send the first half of the client's proof, which needs no challenge (see ``auth``)."""
        self._nonce_c = auth.new_nonce()
        try:
            self._sock.send(self._nonce_c)  # type: ignore[union-attr]  # an empty socket takes it
        except OSError as e:
            self._lost(e)

    def _tls_writable(self) -> None:
        if self._sock is not None:
            self._loop.remove_writer(self._sock.fileno())
        self._tls_step()

    def _retry(self, error: BaseException) -> None:
        """(loop thread, before the handshake completed) Try again later; frames stay queued."""
        if self.closed:
            return
        if self._last_error is None:
            logger.warning(
                "cannot reach %s yet (%s); retrying for up to %ss (MONARCH_PEER_UNREACHABLE_S)",
                self.name,
                error,
                self._unreachable_timeout_s,
            )
        self._last_error = error
        self._close_socket()
        self._handshake.clear()
        self._nonce_s = self._nonce_c = b""
        self._tls_done = False
        self._loop.call_later(self._retry_delay, lambda: self._loop.create_task(self._attempt()))
        self._retry_delay = min(2 * self._retry_delay, RETRY_MAX_S)

    def _unreachable(self) -> None:
        if not self.authenticated:
            why = f"last error: {self._last_error}" if self._last_error else "the handshake never completed"
            self._fail(
                PeerUnreachableError(
                    f"{self.name} could not be reached within {self._unreachable_timeout_s}s ({why})\n"
                    "HINT: MONARCH_PEER_UNREACHABLE_S sets how long a live but unreachable peer "
                    "is waited for before it is declared dead."
                )
            )

    def _readable(self) -> None:
        if self._tls is not None and not self._tls_done:
            self._tls_step()
            if not self._tls_done:
                return
        try:
            with self._lock:  # a TLS socket must not read while another thread writes to it
                data = self._recv()
        except (BlockingIOError, InterruptedError):
            return
        except ssl.SSLError as e:
            self._fail(TlsError(f"TLS with {self.name} failed: {e}\n{TLS_HINT}"))
            return
        except OSError as e:
            self._hung_up(e)
            return
        if not data:
            self._hung_up(ConnectionResetError(f"connection {self.name} closed by peer"))
            return
        self._handshake += data
        if self.authenticated:
            self._read_counts()
            return
        if not self._nonce_s and self._handshake[:4] == auth.TLS_ONLY[:4]:
            self._fail(
                TlsError(
                    f"{self.name} accepts TLS connections only, and this process has no TLS "
                    f"settings: TLS is configured on one side only\n{TLS_HINT}"
                )
            )
            return
        try:
            self._handshake_step()
        except auth.HandshakeError as e:
            self._fail(e)
        except OSError as e:  # the peer went away while we answered its challenge
            self._retry(e)

    def _hung_up(self, error: OSError) -> None:
        """The peer closed the connection: under TLS, right after the TLS handshake and more
        than once in a row, that is its refusal of this process's certificate."""
        if self._tls_done and not self.authenticated and not self._nonce_s:
            self._tls_hangups += 1
            if self._tls_hangups >= TLS_HANGUPS_BEFORE_FAILING:
                self._fail(
                    TlsError(
                        f"{self.name} hung up right after the TLS handshake, {self._tls_hangups} "
                        "times in a row: it refuses this process's certificate (not signed by "
                        f"the CA it trusts, or expired)\n{TLS_HINT}"
                    )
                )
                return
        self._lost(error)

    def _recv(self) -> bytes:
        """What the peer sent (b"" at its end); BlockingIOError if nothing yet."""
        sock = self._sock
        if self._tls is None:
            return sock.recv(256)  # type: ignore[union-attr]
        # TLS decrypts whole records, which may hold more than the readiness of the socket
        # says: read until it has nothing more.
        chunks = []
        while True:
            try:
                chunk = sock.recv(4096)  # type: ignore[union-attr]
            except ssl.SSLWantReadError:
                break
            chunks.append(chunk)
            if not chunk:
                break
        if not chunks:
            raise BlockingIOError
        return b"".join(chunks)

    def _handshake_step(self) -> None:
        if not self._nonce_s:
            if len(self._handshake) < auth.CHALLENGE_BYTES:
                return
            challenge = bytes(self._handshake[: auth.CHALLENGE_BYTES])
            del self._handshake[: auth.CHALLENGE_BYTES]
            self._nonce_s = auth.parse_challenge(challenge)
            self._tls_hangups = 0
            self._sock.sendall(auth.client_digest(self._secret, self._nonce_s, self._nonce_c))  # type: ignore[union-attr]
        if len(self._handshake) < auth.SERVER_PROOF_BYTES:
            return
        if len(self._handshake) > auth.SERVER_PROOF_BYTES:
            raise auth.HandshakeError(f"peer {self.name} sent unexpected data during the handshake")
        auth.check_server_proof(self._secret, self._nonce_c, self._nonce_s, bytes(self._handshake))
        if self._timer is not None:
            self._timer.cancel()
        if self._last_error is not None:
            logger.warning("reached %s", self.name)
        self._handshake.clear()  # from now on: the peer's ``read_count`` records
        with self._lock:
            self.authenticated = True
            if self._queue:  # the greeting
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        if self._resend_from is None:
            self._open()
        else:  # the peer answers the greeting once the previous connection is settled there
            self._timer = self._loop.call_later(self._unreachable_timeout_s, self._not_told)

    def _open(self) -> None:
        """(loop thread) The connection is ready: the frames sent until now go out, and any
        thread may write from now on."""
        with self._lock:
            waiting = self._waiting
            # Nothing but the greeting was written on it yet.
            self.queued_at_handshake = list(waiting) if self.when_authenticated else []
            for frame in waiting:
                self._queue.extend(frame)
                self._frames.append(frame)
            waiting.clear()
            self._writable = True
            if self._queue:
                if not self._flush_scheduled:
                    self._flush_scheduled = True
                    self._loop.call_soon(self._flush)
            else:
                self._wake_drain_waiters()
        for fn in self.when_authenticated:
            fn()
        self.queued_at_handshake = []

    def _read_counts(self) -> None:
        """(loop thread) Act on the peer's ``read_count`` records received."""
        record = read_count.RECORD
        data = self._handshake
        while len(data) >= record.size:
            kind, count = record.unpack_from(data)
            del data[: record.size]
            if kind == read_count.ACK:
                with self._lock:
                    self._forget(count)
            elif kind == read_count.PREVIOUS and self._resend_from is not None and not self._writable:
                self._told(None if count == read_count.UNKNOWN else count)
            else:
                self._fail(
                    auth.HandshakeError(f"peer {self.name} sent unexpected data on a send-only connection")
                )
                return

    def _told(self, read: int | None) -> None:
        """The peer read the first ``read`` frames sent to it (``first_index``; None: it cannot
        tell): of those the previous connections wrote and this one kept, send only the
        others."""
        if self._timer is not None:
            self._timer.cancel()
        first, written = self.first_index, self._resend_written
        if read is None:  # unknown: none is sent again (it may have been read)
            skip, self.unread_lost = written, None  # the peer numbers the next one ``first``
        else:
            skip = min(max(read - first, 0), written)
            self.unread_lost = max(first - read, 0)
            self.first_index += skip  # as the peer does (``IncomingConnection.tell_read``)
        with self._lock:
            for number in range(first, first + skip):
                frame = self._waiting.popleft()
                if read is None:  # the peer may not have read it: reported with the forgotten
                    self._note_unkept(number, frame)
            unkept, self._unkept = self._unkept, []
            if read is not None:
                unkept = _runs_from(unkept, read)
            self.lost = _by_destination(unkept)
            if skip:
                self.frames_sent -= skip
                tags = [(index - skip, tag) for index, tag in self._tags if index >= skip]
                self._tags = collections.deque(tags, maxlen=TAG_RECORD)
        self._open()

    def _not_told(self) -> None:
        if not self._writable:
            self._fail(
                PeerUnreachableError(
                    f"{self.name} did not say within {self._unreachable_timeout_s}s which messages of "
                    "the connection this one replaces it read"
                )
            )

    # -- closing ----------------------------------------------------------------------------

    def _lost(self, error: BaseException) -> None:
        """The socket failed: before the handshake that is worth another try, after it the
        connection (and what was queued on it) is gone."""
        if self.authenticated:
            self._fail(error)
        else:
            self._retry(error)

    def _close_socket(self) -> None:
        connecting, self._connecting = self._connecting, None
        if connecting is not None:
            connecting.cancel()
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with self._lock:
            self._writer_registered = False
        try:
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
        except (ValueError, OSError):
            pass
        sock.close()

    def _fail(self, reason: BaseException) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.close_reason = reason
            self._hold_unwritten()
            self._wake_drain_waiters()
        if self._timer is not None:
            self._timer.cancel()
        self._close_socket()
        self._on_close(self, reason)

    def close(self) -> None:
        """Close after flushing what is queued (loop thread)."""
        if self.closed:
            return
        if self.authenticated:
            self._flush()
        self._fail(ConnectionResetError(f"connection {self.name} closed"))
