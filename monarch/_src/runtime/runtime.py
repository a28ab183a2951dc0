"""The per-process runtime: loop thread, listener, outgoing connections and the router.

Every monarch process has exactly one ``Runtime``. The router is a table from message kind to
handler; upper layers register handlers (the actor layer handles messages, spawns and port
replies). Delivery inside the process skips the socket but not serialization, so a message is
always a copy, as in Monarch.

Thread model: ``send`` may be called from any thread. Frames from one thread to one peer keep
their order (one outgoing connection per peer, FIFO callback queue), which gives Monarch's
per-sender FIFO guarantee, across a dropped connection too: the frames it wrote there that the
peer says it never read (a reset discards what the kernels held), and those it never wrote, go
first on the one replacing it, and the receiver routes a peer's new connection's frames only
once the old one delivered what it carried (``behind``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from monarch._src.runtime import job_files, shm
from monarch._src.runtime.behind import Behind
from monarch._src.runtime.config import CONFIG, transport_of_config
from monarch._src.runtime.fd_limit import raise_fd_limit
from monarch._src.runtime.idle_reads import IdleReads
from monarch._src.runtime.loop_replies import LoopReplies, RuntimeHooks
from monarch._src.runtime.loop_thread import LoopThread, in_empty_context
from monarch._src.runtime.thread_replies import ThreadReplies
from monarch._src.transport import address as addresses
from monarch._src.transport import auth, tls
from monarch._src.transport.connection import IncomingConnection
from monarch._src.transport.listener import Listener
from monarch._src.transport.outgoing import UNRECORDED, Kept, OutgoingConnection
from monarch._src.wire import protocol
from monarch._src.wire.frame import FrameTooLargeError, HeaderTemplate, encode_each, encode_frame, header_of
from monarch._src.wire.protocol import (
    ACTOR,
    FIRST_INDEX,
    KIND,
    PEER_HELLO_KIND,
    PORT_BATCH_KIND,
    PORT_ID,
    PORT_KIND,
    PREVIOUS_CONNECTION,
    PREVIOUS_FRAMES,
    PREVIOUS_KNOWN_FROM,
    PREVIOUS_REPLIES,
    PREVIOUS_REPORTS,
    PREVIOUS_RESENT_FROM,
    REPLY_PORT,
    SENDER,
    SHM_GIVE_BACK_KIND,
    SHM_MOVED,
    SUPERVISION_KIND,
    messages_lost,
    peer_hello,
)

logger = logging.getLogger("monarch.runtime")

#: A frame handler; it owns the list of bodies it is given (and may empty it).
Handler = Callable[[dict, list], None]
PeerLostCallback = Callable[[str, BaseException], None]
#: Told the header of a message this process received but could not deliver, and why.
UndeliverableCallback = Callable[[dict, BaseException], None]
#: Told that a connection with a peer closed with frames possibly undelivered (``replies``:
#: the peer's connection to this process, else this process's to the peer); returns what to do
#: once the peer turns out to be alive, told the reply ports of the calls whose messages were
#: not lost (sent on the connection that replaced it), or None if nothing (a dead peer is
#: reported through PeerLostCallback).
FramesLostCallback = Callable[[str, BaseException, bool], "Callable[[frozenset[int]], None] | None"]
#: Told that replies (PORT and PORT_BATCH frames) a live peer sent to these port ids of this
#: process were lost with its connection, which closed for the reason given.
RepliesLostCallback = Callable[[str, BaseException, list[int]], None]
#: What a peer's hello says of its previous connection: frames written, the index from which
#: the next two are complete, ``[[index, port id], ...]`` of its replies, ``[[index, header],
#: ...]`` of its failure reports, the index from which it sends again the frames not read
#: (None: it sends none again).
Previous = tuple[int, int, list, list, "int | None"]

#: How many of the peers found gone the runtime remembers (``_lost_peers``): an address each.
LOST_PEERS_KEPT = 4096


@dataclass
class _Drop:
    """A peer's connection to this process that closed; settled by the peer's next hello, which
    says how many frames it had written on it (``_settle``), or given up on (``_no_hello``)."""

    #: The connection, and how many frames it read (its hello not counted).
    conn: IncomingConnection
    read: int
    reason: BaseException
    #: The frame the drop cut off (``IncomingConnection.cut_off``): reported as undeliverable
    #: unless the peer's hello shows it sends it again (it had not written all of it).
    cut: tuple[dict, BaseException] | None = None
    timer: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self._read_at_close = self.read

    @property
    def upto(self) -> int | None:
        """What the peer is told was read of all it sent (``IncomingConnection.read_upto``):
        asked when it is told, as a connection that closed while it waited behind an older one
        learns the count only once that one delivered what it carried (``behind``)."""
        return self.conn.read_upto(self._read_at_close)


class Runtime:
    """See the module docstring. The one instance of this process is ``Runtime.current()``."""

    _instance: ClassVar[Runtime | None] = None
    _instance_lock: ClassVar[threading.RLock] = threading.RLock()
    #: Upper layers install their message handlers through these, on every new runtime.
    _start_hooks: ClassVar[list[Callable[[Runtime], None]]] = []

    def __init__(
        self,
        *,
        secret: bytes,
        socket_dir: str,
        listen_sock: socket.socket | None = None,
        owns_socket_dir: bool = False,
        idle_reads: bool = False,
    ) -> None:
        """``idle_reads``: a sync actor's thread reads its messages itself while idle
        (``idle_reads``; a worker's runtime: a client's loop reads its replies faster from
        the loop's own transports)."""
        self.secret = secret
        # Settings first: a bad one raises before anything is made.
        #: What this process's listener, and those of the processes it spawns, listen on.
        self.transport = transport_of_config()
        #: Under TLS (TCP only), the contexts of both sides of a connection.
        self._tls = tls.contexts(CONFIG.tls_cert, CONFIG.tls_key, CONFIG.tls_ca)
        if CONFIG.raise_fd_limit:
            raise_fd_limit()
        self.socket_dir = socket_dir
        self._owns_socket_dir = owns_socket_dir
        #: Names this job's shared-memory buffers (one socket directory per job).
        self.job_tag = os.path.basename(socket_dir.rstrip("/"))
        self._job_lock = job_files.join_job(socket_dir)
        self.max_frame_bytes = CONFIG.max_frame_bytes
        self._socket_seq = 0
        self._seq_lock = threading.Lock()
        if listen_sock is None:
            listen_sock = self.new_listen_socket()
        self.address = addresses.of_listening_socket(listen_sock)
        #: Frames that arrive over TCP come from another host: they must carry every byte.
        unix = addresses.is_unix(self.address)
        self._on_frame = self._receive if unix else self._receive_from_other_host
        #: For connections to loops' reply addresses, read by those loops' threads as well as
        #: this one's: no per-read batching (``after_this_read`` is the runtime loop's alone).
        self._on_reply_frame = self._route_received if unix else self._route_from_other_host
        self._handlers: dict[int, Handler] = {}
        self._conns: dict[str, OutgoingConnection] = {}
        self._conns_lock = threading.Lock()
        self._incoming: set[IncomingConnection] = set()
        self._peer_lost: list[PeerLostCallback] = []
        self._undeliverable: list[UndeliverableCallback] = []
        self._frames_lost: list[FramesLostCallback] = []
        self._replies_lost: list[RepliesLostCallback] = []
        #: Each peer's open connection to this process (the latest one that said hello).
        self._from_peer: dict[tuple[str, str], IncomingConnection] = {}
        #: What a peer said in its hello about its previous connection, while that one is open,
        #: and the connection it said it on (told what was read of the previous one).
        self._said_before: dict[IncomingConnection, tuple[Previous, IncomingConnection]] = {}
        #: Peers' connections that closed, until the peer's next hello settles what was lost.
        self._drops: dict[tuple[str, str], _Drop] = {}
        #: The latest peers found gone (``on_peer_lost``), oldest first, at most ``LOST_PEERS_KEPT``:
        #: a connection of theirs that closes after that is not kept for a hello that cannot come.
        self._lost_peers: dict[str, None] = {}
        #: Connections to a reply address whose close was accounted for before its report came
        #: here (``_first_frame``): their report, still to come, is ignored.
        self._closes_counted: set[IncomingConnection] = set()
        #: A peer's new connection whose frames wait for its old one (the key), until it closed.
        self._behind: dict[IncomingConnection, Behind] = {}
        #: While the loop routes the frames of one read: what they asked to run once it is
        #: routed (``after_this_read``); None between reads.
        self._after_read: list[Callable[[], None]] | None = None
        #: Kinds whose handlers only queue work (see ``register``).
        self._queueing_kinds: set[int] = set()
        self.closed = False
        self.loop_thread = LoopThread()
        self.loop = self.loop_thread.loop
        self._shm = shm.Lending(self, CONFIG.shm_pool_bytes, CONFIG.shm_pool_idle_s)
        #: Reply addresses read by the loops that calls are awaited on (not under TLS).
        self.loop_replies = LoopReplies(
            self,
            RuntimeHooks(self._on_reply_frame, self._reject, self._first_frame, self._incoming_closed),
            enabled=self._tls is None,
        )
        self._reply_addresses = self.loop_replies.addresses
        #: Reply addresses read by the threads that wait in ``Future.get()`` (not under TLS).
        self.thread_replies = ThreadReplies(
            self,
            RuntimeHooks(self._on_reply_frame, self._reject, self._first_frame, self._incoming_closed),
            enabled=self._tls is None,
            addresses=self._reply_addresses,
        )
        #: Peers' connections read by a sync actor's thread while it is idle (not under TLS).
        self.idle_reads = IdleReads(
            self,
            enabled=idle_reads and self._tls is None,
            closed=self._incoming_closed,
            reject=self._reject,
            read_routed=self._read_routed,
        )
        self._handlers[SHM_GIVE_BACK_KIND] = self._shm.given_back_to_us
        self._peer_lost.append(lambda address, reason: self._shm.reclaim(address))
        self._peer_lost.append(self._forget_drops_of)
        with Runtime._instance_lock:
            # Handlers, and this process's instance, must be in place before the first frame:
            # a handler asking for "the runtime" must never start a second one.
            for hook in Runtime._start_hooks:
                hook(self)
            Runtime._instance = self
        self._listener = Listener(
            self.loop,
            listen_sock,
            self._new_incoming,
            self._tls.server if self._tls else None,
        )
        self.loop_thread.call_soon(self._listener.start)

    # -- process-wide instance ----------------------------------------------------------------

    @classmethod
    def current(cls) -> Runtime | None:
        """This process's runtime if one was made (closed or not). Above this layer, use the
        actor layer's ``process_state.runtime()``, which also starts one in a client."""
        return cls._instance

    @classmethod
    def add_start_hook(cls, hook: Callable[[Runtime], None]) -> None:
        """Run ``hook(runtime)`` on every runtime, before it accepts connections."""
        with cls._instance_lock:
            cls._start_hooks.append(hook)
            if cls._instance is not None:
                hook(cls._instance)

    # -- addressing -----------------------------------------------------------------------------

    def new_socket_path(self) -> str:
        with self._seq_lock:
            self._socket_seq += 1
            seq = self._socket_seq
        return os.path.join(self.socket_dir, f"{os.getpid()}-{seq}.sock")

    def new_listen_socket(self) -> socket.socket:
        """A bound, listening socket for this process or one it spawns, on this runtime's
        transport: a Unix socket in the job's directory, or TCP on ``CONFIG.tcp_bind_host``."""
        if self.transport == "tcp":
            return addresses.listen_tcp(CONFIG.tcp_bind_host)
        return addresses.listen_unix(self.new_socket_path())

    def new_reply_socket(self) -> socket.socket:
        """A listening socket for replies to this process (``loop_replies``, ``thread_replies``),
        reached as its own address is: a Unix socket in the job's directory, or TCP on the host
        of its TCP address (a peer must not take it for a process of its own host)."""
        own = addresses.parse(self.address)
        if isinstance(own, addresses.TcpAddress):
            return addresses.listen_tcp(own.host)
        return addresses.listen_unix(self.new_socket_path())

    def is_local(self, address: str) -> bool:
        return address == self.address

    def frames_sent(self) -> dict[str, int]:
        """Frames sent so far to each peer over its current connection (what tests and
        benchmarks count, e.g. that a multicast costs one frame per host)."""
        with self._conns_lock:
            return {address: conn.frames_sent for address, conn in self._conns.items()}

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self.loop_thread.ident

    def reply_address(self, thread_reads: bool = True) -> str:
        """Where replies to a call made on this thread are to be sent: on an event loop other
        than the runtime's, an address that loop reads itself (``loop_replies``), so that a
        reply wakes the awaiting coroutine's loop directly; on a thread with no loop, if
        ``thread_reads``, one that thread reads while it waits in ``Future.get()``
        (``thread_replies``); else this process's address. Not for a call with several
        destinations (the runtime's loop wakes the thread once for all their replies), nor one
        whose arguments may lend shared memory: its receiver gives the files back on its
        connection to this process's address, ahead of the reply, so that the next call finds
        them free; a reply read first by the thread would leave them lent."""
        loop = asyncio._get_running_loop()
        if loop is None:
            return self.thread_replies.address_for_thread() if thread_reads else self.address
        if loop is self.loop:
            return self.address
        return self.loop_replies.address_for(loop)

    # -- routing --------------------------------------------------------------------------------

    def register(self, kind: int, handler: Handler, queues_only: bool = False) -> None:
        """Route frames of ``kind`` to ``handler``. ``queues_only``: it only queues work (for an
        actor's thread) and never waits on the loop, so frames of its kind may leave what they
        queued to be handed over at the end of their read (``after_this_read``); a frame of any
        other kind first has what the frames before it queued handed over, as its handler may
        wait for that (unpickling a distributed tensor waits for its worker's earlier ops)."""
        self._handlers[kind] = handler
        if queues_only:
            self._queueing_kinds.add(kind)

    def on_peer_lost(self, callback: PeerLostCallback) -> None:
        """``callback(address, reason)`` when the peer at ``address`` is taken for dead: its
        process is gone, or it stayed unreachable for ``CONFIG.peer_unreachable_s``."""
        self._peer_lost.append(callback)

    def on_undeliverable(self, callback: UndeliverableCallback) -> None:
        """``callback(header, error)`` for a message received that cannot be delivered (too
        large, no memory for it, its shared-memory buffer gone), so its sender can be told."""
        self._undeliverable.append(callback)

    def on_frames_lost(self, callback: FramesLostCallback) -> None:
        """See ``FramesLostCallback``."""
        self._frames_lost.append(callback)

    def on_replies_lost(self, callback: RepliesLostCallback) -> None:
        """See ``RepliesLostCallback``."""
        self._replies_lost.append(callback)

    def _reject(self, header: dict, error: BaseException) -> None:
        for cb in self._undeliverable:
            try:
                cb(header, error)
            except Exception:
                logger.exception("reporting an undeliverable message failed")

    def dispatch(self, header: dict, bodies: list) -> None:
        handler = self._handlers.get(header.get(KIND))  # type: ignore[arg-type]
        if handler is None:
            logger.error("dropping frame of unknown kind %r", header.get(KIND))
            return
        try:
            handler(header, bodies)
        except Exception:
            logger.exception("handler for frame kind %r failed", header.get(KIND))

    def after_this_read(self, fn: Callable[[], None]) -> bool:
        """Run ``fn`` on the loop thread once every frame of the socket read being routed now
        was routed (a batch of messages for one actor wakes its thread once); False, with
        nothing scheduled, outside such routing (another thread, a timer, a local send)."""
        pending = self._after_read
        if pending is None or threading.get_ident() != self.loop_thread.ident:
            return False
        pending.append(fn)
        return True

    def _read_routed(self) -> None:
        pending, self._after_read = self._after_read, None
        if pending:
            _run_each(pending)

    def send(self, address: str, header: dict, bodies: list, keep: bool = False) -> None:
        """Deliver one message; callable from any thread. Raises FrameTooLargeError at once.

        ``keep``: a frame without bodies (a failure report, which nobody waits for) that must
        not be lost with a connection that drops under a live peer: the next connection's
        hello carries it again (see ``_settle``)."""
        if self._shm.given_back:
            self._shm.flush_given_back()
        if address == self.address or address in self._reply_addresses:
            # Handlers own the list they get (they may empty it), and out-of-band buffers alias
            # the sender's memory: copy both.
            self.dispatch(header, [*bodies[:1], *(bytearray(b) for b in bodies[1:])])
            return
        if self.closed:
            raise RuntimeError(
                "the monarch runtime of this process has been shut down (shutdown_context() or "
                "process exit); nothing more can be sent from it."
            )
        if len(bodies) > 1 and shm.available() and addresses.is_unix(address):
            # Only a Unix socket's peer surely shares this host's /dev/shm (see ``address``).
            bodies = self._shm.export(address, header, bodies)
        # A reply is tagged with its port id, a frame to keep with its header: should the
        # connection drop, the peer learns whether it was written on it (see ``_settle``).
        tag = header if keep else header.get(PORT_ID)
        if tag.__class__ is not int and not keep:
            tag = None
        self._write(address, encode_frame(header, bodies, self.max_frame_bytes), tag)

    def send_templated(self, address: str, template: HeaderTemplate, value: Any, bodies: list) -> None:
        """``send(address, template.header(value), bodies)``; a frame of one body to another
        process (most calls and replies) is encoded from the template, which costs less."""
        if len(bodies) != 1 or address == self.address or self.closed or self._shm.given_back:
            self.send(address, template.header(value), bodies)
            return
        # Tagged as ``send`` tags it: a reply, by its port id.
        tag = value if value.__class__ is int and template.varying == PORT_ID else None
        self._write(address, template.encode(value, bodies, self.max_frame_bytes), tag)

    def send_templated_each(
        self, addresses: list[str], templates: list[HeaderTemplate], value: Any, bodies: list
    ) -> None:
        """``send_templated`` of one call (MSG frames, ``value`` its reply port) to each of
        ``addresses``, the header of each from its template (they differ in the rank only).
        Small frames to other processes, most calls, share one encoding of what they have in
        common (``encode_each``); none is tagged, as ``send`` tags only replies."""
        frames = None
        if (
            len(bodies) == 1
            and not self.closed
            and not self._shm.given_back
            and self.address not in addresses
        ):
            frames = encode_each(templates, value, bodies[0], self.max_frame_bytes)
        if frames is None:
            for address, template in zip(addresses, templates):
                self.send_templated(address, template, value, bodies)
            return
        for address, frame in zip(addresses, frames):
            self._write(address, frame, None)

    def _write(self, address: str, buffers: list, tag: Any) -> None:
        conn = self._conns.get(address)
        if conn is None or conn.closed:
            conn = self._connect(address)
        try:
            conn.send(buffers, tag)
        except ConnectionError:
            # It closed after it was looked up, before taking the frame: the frame goes on the
            # connection that replaces it (which reports the peer lost if it is gone).
            try:
                self._connect(address).send(buffers, tag)
            except ConnectionError as e:
                logger.debug("send to %s failed: %s", address, e)

    def _receive(self, header: dict, bodies: list) -> None:
        """A frame from another process: map its shared-memory buffers, then route it."""
        pending = self._after_read
        if pending is None:
            self._after_read = []  # until the end of this read (_read_routed)
        elif pending and header.get(KIND) not in self._queueing_kinds:
            self._after_read = []  # its handler may wait for what was queued: hand it over now
            _run_each(pending)
        self._route_received(header, bodies)

    def _route_received(self, header: dict, bodies: list) -> None:
        """Map a received frame's shared-memory buffers, then route it (any thread)."""
        if SHM_MOVED not in header:  # most frames: nothing to map
            handler = self._handlers.get(header.get(KIND))  # type: ignore[arg-type]
            if handler is None:
                self.dispatch(header, bodies)  # logs it
                return
            try:
                handler(header, bodies)
            except Exception:
                logger.exception("handler for frame kind %r failed", header.get(KIND))
            return
        try:
            self._shm.receive(header, bodies)
        except FrameTooLargeError as e:
            logger.error("rejecting a message over this process's frame limit: %s", e)
            self._reject(header, e)
            return
        except (OSError, ValueError, TypeError, IndexError) as e:
            logger.error("rejecting a message whose shared-memory buffer is unusable: %s", e)
            self._reject(
                header,
                OSError(
                    f"a shared-memory buffer of this message could not be mapped by the "
                    f"receiving process (pid {os.getpid()}): {e}\n"
                    "HINT: something removed the message's file from /dev/shm before it "
                    "was received (a cleanup job, or a full /dev/shm); send it again."
                ),
            )
            return
        self.dispatch(header, bodies)

    def _receive_from_other_host(self, header: dict, bodies: list) -> None:
        """A frame that came over TCP: it may not name files of this host's /dev/shm."""
        if not self._names_shared_memory(header):
            self._receive(header, bodies)  # nothing to map: routed as any frame

    def _route_from_other_host(self, header: dict, bodies: list) -> None:
        """``_receive_from_other_host`` for a loop's reply connection (see ``_on_reply_frame``)."""
        if not self._names_shared_memory(header):
            self._route_received(header, bodies)

    def _names_shared_memory(self, header: dict) -> bool:
        """Whether a frame from another host names shared memory, which it cannot: rejected."""
        if not header.get(SHM_MOVED):
            return False
        logger.error("rejecting a message from another host that refers to shared memory")
        self._reject(
            header,
            ValueError(
                "a message that arrived over TCP referred to shared-memory files; only "
                "processes of one host, connected by Unix sockets, share memory"
            ),
        )
        return True

    def _connect(self, address: str) -> OutgoingConnection:
        with self._conns_lock:
            conn = self._conns.get(address)
            if conn is not None and not conn.closed:
                return conn
            # The peer is told how many frames the connection this one replaces carried (it
            # stays listed until replaced when it had been authenticated), and which were
            # replies, so that it can tell which of them it lost.
            question = None
            resend = None
            first_index = 0
            when_alive: Callable[[OutgoingConnection], None] | None = None
            if conn is not None:
                if conn.authenticated:
                    # The frames it never wholly wrote go first on the new one, before any
                    # newer frame (none can be sent on it before it is listed, below), after
                    # those it wrote that the peer did not read, if it kept them.
                    resend = conn.take_unread()
                    when_alive = self._replacing(address, conn)
                if resend is not None and conn.unanswered:
                    # It wrote nothing but its hello, which the peer may never have read: then
                    # the peer still takes the connection that hello asked about for the
                    # previous one, and asked about this one ("0 frames written") it would
                    # answer that none of that one's frames were read (they would run twice),
                    # without waiting for those still on their way. So the same question goes
                    # again, naming the same connection: the peer tells by that name whether it
                    # answered it already (``_first_frame``).
                    question = conn.question
                else:
                    known_from, tagged = conn.sent_tags()
                    replies = [entry for entry in tagged if entry[1].__class__ is int]
                    reports = [entry for entry in tagged if entry[1].__class__ is dict]
                    resent_from = resend.written_from if resend is not None else None
                    question = ((conn.frames_sent, known_from, replies, reports, resent_from), conn.nonce)
                # Its frames are numbered on from the previous one's (``read_count``).
                first_index = conn.first_index + conn.frames_sent if resend is None else resend.first_index
            previous, of = question or (None, b"")
            hello = encode_frame(
                peer_hello(self.address, previous, first_index, of), [], self.max_frame_bytes
            )
            new = self._new_outgoing(
                address,
                on_close=lambda c, reason: self._outgoing_closed(address, c, reason),
                name=address,
                greeting=hello,
                resend=resend,
                first_index=first_index,
            )
            new.question = question
            if when_alive is not None:
                new.when_authenticated.append(functools.partial(when_alive, new))
            self._conns[address] = new
        self.loop_thread.call_soon(in_empty_context, self.loop.create_task, new.connect())
        return new

    def _replacing(self, address: str, closed: OutgoingConnection) -> Callable[[OutgoingConnection], None]:
        """(``_conns_lock`` held) ``closed``, authenticated, is being replaced: what the new
        connection does once it finds the peer alive. Calls waiting on the peer now may have
        lost their messages with ``closed``, and fail then, but for those whose messages the
        new connection carried (if the peer is gone, it is reported lost, which fails them)."""
        reason = closed.close_reason or ConnectionResetError(f"connection to {address} closed")
        logger.debug("connection to %s lost (%s); reconnecting", address, reason)
        on_alive = self._when_found_alive(address, reason, replies=False)

        def found_alive(new: OutgoingConnection) -> None:
            logger.warning("connection to %s re-established after: %s", address, reason)
            if new.unread_lost == 0:  # every message the peer did not read goes again
                return
            if new.unread_lost is None:
                logger.warning(
                    "%s could not tell which messages it read of the connection that closed: "
                    "calls among them fail; the owners of the actors the others were for hear "
                    "that they may be lost",
                    address,
                )
            else:
                logger.error(
                    "%d messages written to %s were never read there, and this process no longer "
                    "kept them to send again: calls among them fail; the owners of the actors the "
                    "others were for hear of their loss\n%s",
                    new.unread_lost,
                    address,
                    _keep_hint(),
                )
            self._report_lost(address, new, reason)
            spared = _reply_ports(new.queued_at_handshake)
            _run_each([functools.partial(fn, spared) for fn in on_alive])

        return found_alive

    def _report_lost(self, address: str, new: OutgoingConnection, reason: BaseException) -> None:
        """Tell the live peer at ``address`` where the messages it never read, and that this
        process no longer kept (``new.lost``), were going: it reports their loss to the owners
        of the actors they were for (``undelivered.messages_lost``)."""
        lost = [
            [None if where == UNRECORDED else where, n] for where, n in new.lost.items() if where is not None
        ]
        if not lost:
            return
        uncertain = new.unread_lost is None
        if uncertain:
            why = (
                f"the connection closed ({reason}), and this process could not say which of "
                "the messages written there it had read: they are not sent again, so that none "
                "runs twice"
            )
        else:
            why = (
                f"the connection closed ({reason}) before this process read them, and the "
                f"sender no longer kept them to send again\n{_keep_hint()}"
            )
        try:
            self.send(address, messages_lost(self.address, lost, why, uncertain), [])
        except ConnectionError as e:  # closed again: the peer's loss, if it is gone, is reported
            logger.error("could not tell %s of the messages it lost: %s", address, e)

    def _new_outgoing(
        self,
        address: str,
        on_close: Callable[[OutgoingConnection, BaseException], None],
        name: str,
        greeting: list | None = None,
        resend: Kept | None = None,
        first_index: int = 0,
    ) -> OutgoingConnection:
        return OutgoingConnection(
            self.loop,
            address,
            self.secret,
            on_close=on_close,
            name=name,
            loop_ident=self.loop_thread.ident,
            unreachable_timeout_s=CONFIG.peer_unreachable_s,
            tls=self._tls.client if self._tls else None,
            greeting=greeting,
            resend=resend,
            keep=(CONFIG.resend_keep_messages, CONFIG.resend_keep_bytes),
            first_index=first_index,
            destination=_lost_destination,
        )

    def _outgoing_closed(self, address: str, conn: OutgoingConnection, reason: BaseException) -> None:
        if self.closed or not conn.authenticated:
            with self._conns_lock:
                if self._conns.get(address) is conn:
                    del self._conns[address]
        if conn.authenticated and not self.closed:
            # A live peer may have dropped only this connection: connect again to find out
            # (the new one replaces it in ``_conns``, unless a sender's ``_connect`` did first).
            self._connect(address)
            return
        self._unsent(address, conn.take_held()[0][conn.written_before :], reason)
        if self.closed:
            return
        for cb in list(self._peer_lost):
            try:
                cb(address, reason)
            except Exception:
                logger.exception("peer-lost callback failed")

    def _unsent(self, address: str, frames: list[list], reason: BaseException) -> None:
        """Frames never sent to ``address``, which is lost (or this runtime shut down). Calls
        among them fail with the peer's loss (``on_peer_lost``), and the owners of actors there
        hear of their process's death; the rest had no one left to tell: logged."""
        if not frames:
            return
        kinds = collections.Counter(_KIND_NAMES.get(header_of(frame).get(KIND), "?") for frame in frames)
        logger.warning(
            "%d messages to %s were never sent (%s): %s",
            len(frames),
            address,
            reason,
            ", ".join(f"{n} {kind}" for kind, n in kinds.items()),
        )

    def _when_found_alive(
        self, address: str, reason: BaseException, replies: bool
    ) -> list[Callable[[frozenset[int]], None]]:
        """What the upper layers do once ``address``, whose connection closed, is found alive."""
        return [f for cb in self._frames_lost if (f := cb(address, reason, replies)) is not None]

    def _new_incoming(self) -> IncomingConnection:
        conn = IncomingConnection(
            secret=self.secret,
            max_frame_bytes=self.max_frame_bytes,
            on_frame=lambda header, bodies: self._first_frame(conn, header, bodies),
            on_reject=self._reject,
            on_close=self.idle_reads.ended if self.idle_reads.enabled else self._incoming_closed,
            name=f"<-{self.address}",
            local_address=self.address,
            on_read_done=(lambda: self.idle_reads.read_done(conn))
            if self.idle_reads.enabled
            else self._read_routed,
            defer_cut_off=True,  # settled with the peer's next hello (``_settle``)
        )
        self._incoming.add(conn)
        return conn

    def _first_frame(
        self, conn: IncomingConnection, header: dict, bodies: list, route: Handler | None = None
    ) -> None:
        """A peer's first frame names the address it listens at (see ``_connect``); it comes
        after the handshake, so it is trusted. Later frames go straight to the router (or to
        ``route``)."""
        conn.on_frame = route = route or self._on_frame
        sender = header.get(SENDER)
        if header.get(KIND) != PEER_HELLO_KIND or not isinstance(sender, str):
            route(header, bodies)
            return
        conn.peer = sender
        conn.first_index = header.get(FIRST_INDEX, 0)
        conn.start_acks()
        if route is self._on_frame:
            self.idle_reads.said_hello(conn)
        link = _link(conn)
        before = self._from_peer.get(link)
        if before is not None and before.closed:
            self._close_seen(before)
            before = None
        self._from_peer[link] = conn
        frames = header.get(PREVIOUS_FRAMES)
        if frames is None:
            return
        said = (
            frames,
            header.get(PREVIOUS_KNOWN_FROM, 0),
            header.get(PREVIOUS_REPLIES) or [],
            header.get(PREVIOUS_REPORTS) or [],
            header.get(PREVIOUS_RESENT_FROM),
        )
        # The peer waits to hear how many frames of the previous connection were read.
        conn.read_count_due = said[4] is not None
        # The connection the question is about (its handshake's nonce), or one that asked it
        # already: the peer asks again when it never heard the answer (``Runtime._connect``).
        about = conn.asked_about = header.get(PREVIOUS_CONNECTION)
        drop = self._drops.get(link) if before is None else None
        latest = before if drop is None else drop.conn
        if about is None or latest is None or about not in (latest.nonce, latest.asked_about):
            # No record of it: its hello never read here (nor any frame of it), or the record
            # given up on (``_no_hello``).
            self._settle_unknown(sender, said, conn)
            return
        if drop is not None:
            del self._drops[link]
            if drop.timer is not None:
                drop.timer.cancel()
        if about != latest.nonce:
            self._asked_again(link, latest, conn, route)
            if drop is None:
                # Its peer replaced it (its drop not seen here yet: it may wait behind an older
                # connection, paused); it carried nothing but its hello: it ends here, accounted
                # for.
                self._closes_counted.add(latest)
                latest.abort(
                    ConnectionResetError(f"{sender} replaced it before it was told what was read"), False
                )
        elif drop is None:
            self._said_before[latest] = (said, conn)  # its close, still to come here, settles it
            self._queue_behind(conn, latest, frames, route)
        else:
            self._settle(sender, drop, said, conn)

    def _asked_again(
        self, link: tuple[str, str], asked: IncomingConnection, conn: IncomingConnection, route: Handler
    ) -> None:
        """The peer's hello on ``conn`` asks again what ``asked``'s asked: ``asked`` closed at
        the peer's end before the answer got there (the peer wrote nothing on it but that
        hello, which it cannot know was read here, see ``_connect``). ``conn`` waits in its
        place for the answer, or is told what ``asked`` was told; nothing is settled twice
        (what was lost was settled with that answer)."""
        if asked.read_count_due and self._wait_in_place(link, asked, conn, route):
            return
        conn.tell_read(asked.told)  # (None, unknown, if never told: nothing runs twice)

    def _wait_in_place(
        self, link: tuple[str, str], replaced: IncomingConnection, conn: IncomingConnection, route: Handler
    ) -> bool:
        """The peer replaced ``replaced`` by ``conn`` while ``replaced`` waited behind an older
        connection, still open (``_queue_behind``), before it was told what was read (it
        closed, or its drop was not seen yet: ``conn``'s hello came first): ``conn`` waits
        there in its place, and is told once the older one delivered what it carried, or closed
        (``replaced`` carried nothing but its hello: its peer writes only once told). False if
        ``replaced`` waits behind no connection of ``link`` (the older one closed: it was told
        now, ``_close_seen``)."""
        for old, waiting in list(self._behind.items()):
            if _link(old) != link:
                continue
            if old.closed:  # its report still to come: ``replaced`` is told what was read now
                self._close_seen(old)
            elif waiting.hand_over(replaced, conn, route):
                said, _ = self._said_before[old]
                self._said_before[old] = (said, conn)
                return True
        return False

    def _close_seen(self, conn: IncomingConnection) -> None:
        """``conn``, a connection to a reply address read by another thread (or earlier in this
        loop's turn), ended there, and its report (``incoming_closed``, sent here) has not run
        yet: it is accounted for now, so that a hello that comes first is answered exactly (its
        drop recorded, or the connection waiting behind it told); the report is ignored."""
        self._incoming_closed(conn, conn.close_reason)
        self._closes_counted.add(conn)

    def _queue_behind(
        self, conn: IncomingConnection, before: IncomingConnection, written: int, route: Handler
    ) -> None:
        """The peer's new connection ``conn`` said hello while ``before``, the one it replaces,
        may still have frames to read, older than ``conn``'s: ``conn``'s wait (``behind``)."""
        unrouted = functools.partial(self.idle_reads.unrouted, before)
        # Read by the loop alone from now on: an idle thread's read of it is over (its frames
        # counted, those it declined on their way here), so what it read is known here.
        self.idle_reads.pin(before)
        if before.frames_read - unrouted() - 1 < written:  # its hello is not counted
            self.idle_reads.pin(conn)  # until it is released
            self._behind[before] = Behind(self.loop, conn, before, written, route, self._route_held, unrouted)
        else:
            conn.tell_read(before.read_upto(written))

    def _route_held(self, conn: IncomingConnection, route: Handler, frames: list[tuple[dict, list]]) -> None:
        """Route the frames of ``conn`` that waited (``behind``; none, once all were), as the
        frames of a read; from now on its frames go straight to the router (an idle thread may
        read it). A reply address's (released on whichever thread read its old connection)
        are routed as they come there: no batching per read, which is the runtime loop's."""
        if route is not self._on_frame:
            for header, bodies in frames:
                route(header, bodies)
            return
        outside_read = self._after_read is None  # else the read being routed ends it
        for header, bodies in frames:
            route(header, bodies)
        if outside_read:
            self._read_routed()
        self.idle_reads.said_hello(conn)

    def _incoming_closed(self, conn: IncomingConnection, reason: BaseException | None) -> None:
        """A peer's connection to this process closed. If the peer lives on (only the connection
        dropped), frames it had sent on it may be lost: replies to this process's calls among
        them. It reconnects at once and says in its hello how many frames it had written, and
        which were replies: those this process did not read fail their calls (``_settle``);
        calls still running there complete over the new connection. A peer that exited is
        reported as lost instead (``on_peer_lost``)."""
        self._incoming.discard(conn)
        if conn in self._closes_counted:  # as the peer's next hello came first (``_first_frame``)
            self._closes_counted.discard(conn)
            return
        peer = conn.peer
        if self.closed:
            return
        if peer is None:
            if conn.cut_off is not None:
                self._reject(*conn.cut_off)
            return
        link = _link(conn)
        if self._from_peer.get(link) is conn:
            del self._from_peer[link]
        reason = reason or ConnectionResetError(f"connection from {peer} closed")
        read = conn.frames_read - 1  # its hello is not counted
        drop = _Drop(conn, read=read, reason=reason, cut=conn.cut_off)
        said = self._said_before.pop(conn, None)
        if said is not None:
            self._settle(peer, drop, *said)
            waiting = self._behind.pop(conn, None)
            if waiting is not None:
                waiting.release()
            return
        if peer in self._lost_peers:  # (its connection ended after its process did)
            if conn.cut_off is not None:
                self._reject(*conn.cut_off)
            return
        earlier = self._drops.get(link)
        if earlier is not None:
            if earlier.timer is not None:
                earlier.timer.cancel()
            if earlier.cut is not None:  # no hello will tell of it any more
                self._reject(*earlier.cut)
        self._drops[link] = drop
        drop.timer = self.loop.call_later(CONFIG.peer_unreachable_s, self._no_hello, link, drop)

    def _settle(self, peer: str, drop: _Drop, said: Previous, teller: IncomingConnection) -> None:
        """``peer`` said (on ``teller``) it wrote ``frames`` frames on the connection that
        dropped, which were replies and failure reports from index ``known_from`` on, and that it
        sends again those from ``resent_from`` on that this process did not read: tell it how many
        were read, deliver the reports this process did not read and will not get again, and
        tell the upper layers which replies were lost."""
        frames, known_from, replies, reports, resent_from = said
        told = drop.upto
        teller.tell_read(told)
        if resent_from is not None and told is not None:
            # What it still kept comes again: only the older are lost (told that what was read
            # is unknown, it sends none again).
            frames = max(drop.read, min(frames, resent_from))
        if drop.cut is not None and frames > drop.read:
            # The peer wrote the frame cut off here (or began to): it does not send it again. A
            # peer that keeps what it wrote (``resent_from``) reports it with the others it no
            # longer kept if it reports such a frame (MESSAGES_LOST, see ``_report_lost``); else
            # it is reported here.
            if resent_from is None or _destination(drop.cut[0]) is None:
                self._reject(*drop.cut)
            drop.read += 1
        if frames <= drop.read:
            return  # every frame was read (a frame cut off is sent again): nothing lost
        # Lost: the frames from ``drop.read`` to ``frames``; those after come again.
        self._frames_lost_from(peer, drop.reason, (frames, known_from, replies, reports), drop.read)

    def _settle_unknown(self, peer: str, said: Previous, teller: IncomingConnection) -> None:
        """``peer`` asks (on ``teller``) what was read of a connection this process kept no
        record of (its hello was never read here, or its drop was given up on, ``_no_hello``):
        it is told that this cannot be said, and sends none of its frames again, as any may
        have been read. The calls whose replies it says it wrote there fail (every call waiting
        on it, if it kept no record of some of those frames); failure reports among them are
        delivered (once: a report of a rank already failed is ignored)."""
        teller.tell_read(None)
        frames, known_from, replies, reports, _ = said
        if frames <= 0:
            return
        logger.warning(
            "%s asks which of the %d frames it wrote on a connection to %s that closed were read, "
            "and this process kept no record of that connection: the calls whose replies were "
            "among them fail",
            peer,
            frames,
            teller.local_address,
        )
        reason = ConnectionResetError(
            f"a connection from {peer} to {teller.local_address} closed, and which of the "
            f"{frames} messages it carried were read here is not known, so none is sent again"
        )
        self._frames_lost_from(peer, reason, (frames, known_from, replies, reports), 0)

    def _frames_lost_from(
        self, peer: str, reason: BaseException, said: tuple[int, int, list, list], read: int
    ) -> None:
        """The frames from ``read`` to ``frames`` that ``peer`` wrote on a connection that
        closed may be lost, and are not sent again: deliver the failure reports among them and
        fail the calls whose replies were among them (every call waiting on ``peer``, if it
        kept no record of some of those frames: before ``known_from``)."""
        frames, known_from, replies, reports = said
        for index, header in reports:
            if read <= index < frames and isinstance(header, dict):
                self.dispatch(header, [])
        if read >= known_from:
            lost = [port_id for index, port_id in replies if read <= index < frames]
            for cb in self._replies_lost:
                try:
                    cb(peer, reason, lost)
                except Exception:
                    logger.exception("replies-lost callback failed")
            return
        # More frames were lost than the peer kept a record of: any reply may be among them.
        logger.error(
            "%d frames from %s were lost with its connection (%s), more than it kept a record "
            "of: failure reports among the oldest of them may be lost",
            frames - read,
            peer,
            reason,
        )
        for fn in self._when_found_alive(peer, reason, replies=True):
            fn(frozenset())

    def _forget_drops_of(self, peer: str, reason: BaseException) -> None:
        """(``on_peer_lost``) ``peer`` exited: no hello of its will settle the connections of its
        that closed, and its loss is reported already; their records (each holding its
        connection and read buffer) go now rather than after ``peer_unreachable_s``."""
        self._lost_peers[peer] = None
        if len(self._lost_peers) > LOST_PEERS_KEPT:
            del self._lost_peers[next(iter(self._lost_peers))]
        for link in [link for link in self._drops if link[0] == peer]:
            drop = self._drops.pop(link)
            if drop.timer is not None:
                drop.timer.cancel()
            if drop.cut is not None:
                self._reject(*drop.cut)

    def _no_hello(self, link: tuple[str, str], drop: _Drop) -> None:
        """A peer whose connection closed did not reconnect within ``peer_unreachable_s``. If it
        is alive, the replies it had sent cannot be known: calls waiting on it fail rather than
        wait forever (a peer that exited is reported as lost instead)."""
        if self._drops.get(link) is drop:
            del self._drops[link]
        if drop.cut is not None:
            self._reject(*drop.cut)
        peer = link[0]
        on_alive = self._when_found_alive(peer, drop.reason, replies=True)
        if not on_alive or self.closed:
            return
        # Whether the peer lives is known only by reaching it anew.
        probe = self._new_outgoing(peer, on_close=lambda c, why: None, name=f"liveness check of {peer}")
        probe.when_authenticated.extend(functools.partial(fn, frozenset()) for fn in on_alive)
        probe.when_authenticated.append(probe.close)
        in_empty_context(self.loop.create_task, probe.connect())

    # -- shutdown -------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Close every connection and stop the loop thread. Idempotent."""
        if self.closed:
            return
        self.closed = True

        async def close_all() -> None:
            self._listener.close()
            self.loop_replies.close()
            self.thread_replies.close()
            self.idle_reads.close()
            outgoing = list(self._conns.values())
            # Deliver what was sent before shutdown (e.g. "actor stopped" notices), bounded.
            if outgoing:
                await asyncio.wait([asyncio.ensure_future(c.drained()) for c in outgoing], timeout=1.0)
            for conn in outgoing + list(self._incoming):
                conn.close()
            await asyncio.sleep(0)

        if not self.loop.is_closed():
            try:
                if self.on_loop_thread():
                    self.loop.create_task(close_all())
                else:
                    self.loop_thread.run_sync(close_all(), timeout=2)
            except Exception:
                logger.debug("error while closing connections", exc_info=True)
            self.loop_thread.stop()
        addresses.remove_socket_file(self.address)
        self._shm.close()
        if self._owns_socket_dir:
            job_files.remove(self.socket_dir)
        # Runtime._instance keeps pointing here: late senders get a clear error, and never a
        # fresh runtime with another secret.

    def leave_orphaned_job(self) -> None:
        """This process's parent died without stopping it: remove what this process made, and
        if it is the last process of the job, the job's socket directory and shared-memory
        files too (a client killed with -9 cannot, and no one else is left to). Callable from
        any thread, even while the loop is busy: it touches only files."""
        addresses.remove_socket_file(self.address)
        self._shm.close()
        if self._job_lock is not None and job_files.last_to_leave(self._job_lock):
            job_files.remove(self.socket_dir)


def _link(conn: IncomingConnection) -> tuple[str, str]:
    """A peer's connection to one address of this process (its own, or a loop's reply address,
    see ``loop_replies``): each is dropped and replaced, and its frames counted, on its own."""
    return conn.peer, conn.local_address  # type: ignore[return-value]


#: Frame kinds by number, for messages.
_KIND_NAMES = {value: name[:-5].lower() for name, value in vars(protocol).items() if name.endswith("_KIND")}


#: Frames whose loss is reported otherwise: replies (the peer fails the calls they answer, as
#: the next hello tells which were written) and failure reports (the hello carries them again).
_TOLD_OTHERWISE = frozenset((PORT_KIND, PORT_BATCH_KIND, SUPERVISION_KIND, PEER_HELLO_KIND))


def _lost_destination(frame: list) -> Any:
    """``_destination`` of a frame forgotten unread (``OutgoingConnection.lost``): asked only of
    such frames, when a peer reads nothing for long, or the resend bounds are set low."""
    return _destination(header_of(frame))


def _destination(header: dict) -> Any:
    """Whom the loss of a frame with ``header`` is reported to by its sender (MESSAGES_LOST):
    the actor of a message nobody waits on, or the kind of a frame for no actor; None for one
    with a reply port (its call fails, ``undelivered.connection_lost``) and for those reported
    otherwise (``_TOLD_OTHERWISE``)."""
    kind = header.get(KIND)
    if kind in _TOLD_OTHERWISE or header.get(REPLY_PORT).__class__ is list:
        return None
    actor = header.get(ACTOR)
    return actor if actor.__class__ is str else kind


def _keep_hint() -> str:
    return (
        "HINT: MONARCH_RESEND_KEEP_MESSAGES and MONARCH_RESEND_KEEP_BYTES "
        f"({CONFIG.resend_keep_messages}, {CONFIG.resend_keep_bytes}) bound what a process keeps of "
        "the messages its peers have not acknowledged: raise them."
    )


def _reply_ports(frames: list[list]) -> frozenset[int]:
    """The port ids the answers to these frames (calls, stops, ...) of this process go to."""
    ports = set()
    for frame in frames:
        spec = header_of(frame).get(REPLY_PORT)
        if spec.__class__ is list and len(spec) == 2:
            ports.add(spec[1])
    return frozenset(ports)


def _run_each(work: list[Callable[[], None]]) -> None:
    """Run what frames of a read asked for (``after_this_read``); one failing stops no other."""
    for fn in work:
        try:
            fn()
        except Exception:
            logger.exception("work scheduled after a read failed")


def _leave_job_in_fork_child() -> None:
    """A fork of a monarch process is not a process of its job: drop its copy of the job lock
    (closing the descriptor releases nothing the parent still holds)."""
    rt = Runtime._instance
    if rt is not None and rt._job_lock is not None:
        os.close(rt._job_lock)
        rt._job_lock = None


os.register_at_fork(after_in_child=_leave_job_in_fork_child)


def new_client_runtime() -> Runtime:
    secret = auth.new_secret()
    socket_dir = job_files.new_job_dir()
    try:
        # Shut down at exit by ``shutdown_context`` (host layer), after the workers it spawned.
        return Runtime(secret=secret, socket_dir=socket_dir, owns_socket_dir=True)
    except BaseException:  # a bad setting, say: leave no job directory behind
        job_files.remove(socket_dir)
        raise
