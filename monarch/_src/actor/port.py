"""Ports: the one primitive every reply travels on.

A ``Port`` names a receiver in some process (address + port id, plus the rank of the sender
for replies to a mesh call); it pickles as that name, so it can be passed to any actor, which
then sends straight to the receiver's process. On the receiving side a port id maps to a
``PortHandler``: a ``PortReceiver`` queue for user channels, or a collector behind
``call``/``call_one``/``choose``/``stream``. Handlers run on whichever thread delivers the
message and are therefore thread-safe. A value that may wait as it unpickles (a distributed
tensor, in a process hosting its tensor worker: ``unpickle_off_loop``) is unpickled on a thread of
its own, and the values sent to its port after it are handed over after it (``_deliver``).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from monarch._src.actor import supervision
from monarch._src.actor.errors import ActorError, SupervisionError
from monarch._src.actor.future import Future, pending_future, set_exception, set_result
from monarch._src.actor.process_state import runtime
from monarch._src.actor.unpickle_off_loop import WAITING_GLOBALS, may_wait, start_thread
from monarch._src.wire import payload
from monarch._src.wire.frame import HeaderTemplate
from monarch._src.wire.protocol import FLAG_EXCEPTION, FLAGS, PORT_ID, RANK, REPLIES, port_value

R = TypeVar("R")

logger = logging.getLogger("monarch.actor")

_port_ids = itertools.count(1)
#: port id -> handler. Plain dict: single operations are atomic under the GIL. The handlers
#: waiting on a reply from a process are found here when it dies (``waiting_on``): a death is
#: rare, a call is not, so a call registers nothing else.
_handlers: dict[int, PortHandler] = {}
#: port id -> channel receiver, weakly: a receiver its user let go of goes, and what is sent
#: to it afterwards is dropped as for any closed port (nobody could ever read it). One that a
#: ``recv()`` waits on stays (``_waited``): its Future may be all its user kept.
_receivers: dict[int, weakref.ref[PortReceiver[Any]]] = {}
_waited: set[PortReceiver[Any]] = set()
#: port id -> the values sent to it (rank, pickled, is an exception) still to be unpickled by the
#: thread that unpickles one that may wait (``_off_loop``): listed while that thread runs, so
#: that the values sent after it are handed over after it.
_ports_off_loop: dict[int, collections.deque[tuple[int | None, list, bool]]] = {}
_off_loop_lock = threading.Lock()


def _receiver(port_id: int | None) -> PortReceiver[Any] | None:
    ref = _receivers.get(port_id)  # type: ignore[arg-type]
    return ref() if ref is not None else None


class PortHandler:
    """Receives the messages sent to one port id."""

    port_id: int = 0
    #: What the caller is waiting for, for error messages ("mesh.endpoint").
    label: str = "port"
    #: Processes a reply is expected from (see ``expect_from``).
    _addresses: Iterable[str] = ()
    #: True for a handler that takes frames as they came (``deliver_frame``), not unpickled.
    raw_frames = False

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        raise NotImplementedError

    def deliver_frame(self, header: dict, bodies: list) -> None:
        """A PORT frame for a ``raw_frames`` handler (one that passes replies on unread)."""
        raise NotImplementedError

    def fail(self, exc: BaseException) -> None:
        """The process a reply was expected from is gone."""

    def open(self) -> int:
        """Register this handler under a fresh port id, so that frames addressed to it reach it."""
        self.port_id = next(_port_ids)
        _handlers[self.port_id] = self
        return self.port_id

    def close(self) -> None:
        """Unregister the port id: later frames to it are dropped as having no receiver, and
        the death of a process it expected a reply from no longer fails it."""
        _handlers.pop(self.port_id, None)

    def expect_from(self, addresses: Iterable[str]) -> None:
        """Fail this handler if a process it waits on dies (at once if one already has). Only
        open handlers are looked at when a process dies (``waiting_on``); a list of addresses
        is kept as given, not copied."""
        self._addresses = addresses = addresses if type(addresses) is list else set(addresses)
        if supervision.dead_processes:
            for a in addresses:
                report = supervision.dead_processes.get(a)
                if report is not None:
                    self.stop_expecting()
                    self.fail(SupervisionError(f"Endpoint call {self.label}() failed, {report}"))
                    return

    def stop_expecting(self) -> None:
        """Stop watching the processes given to ``expect_from`` (the reply came, or none will be sent)."""
        self._addresses = ()


def fail_waiting_on(address: str, exc_factory: Any) -> None:
    """Fail every pending reply expected from the process at ``address`` (once each)."""
    for h in waiting_on(address):
        rest = h._addresses
        h._addresses = [a for a in rest if a != address]
        h.fail(exc_factory(h))


def waiting_on(address: str) -> list[PortHandler]:
    """The open handlers now waiting on a reply from the process at ``address``."""
    receivers = [r for ref in list(_receivers.values()) if (r := ref()) is not None]
    return [h for h in [*list(_handlers.values()), *receivers] if address in h._addresses]


def handler_of(port_id: int | None) -> PortHandler | None:
    """The handler receiving on ``port_id`` in this process, if it is still open."""
    return _handlers.get(port_id) or _receiver(port_id)  # type: ignore[arg-type]


def handle_port_frame(header: dict, bodies: list) -> None:
    handler = _handlers.get(header[PORT_ID]) or _receiver(header[PORT_ID])
    if handler is None:
        return  # receiver gone (e.g. a `choose` reply after completion): nothing to do
    if handler.raw_frames:
        handler.deliver_frame(header, bodies)
        return
    _deliver(handler, header.get(RANK), bodies, FLAGS in header and bool(header[FLAGS] & FLAG_EXCEPTION))


def handle_port_batch(header: dict, bodies: list) -> None:
    """Replies of several ranks gathered on their host (``multicast``), delivered one by one."""
    handler = handler_of(header[PORT_ID])
    pos = 0
    for rank, count in header[REPLIES]:
        if handler is None or handler_of(handler.port_id) is not handler:
            return  # receiver gone, or done (it failed on an earlier reply)
        _deliver(handler, rank, bodies[pos : pos + count], False)
        pos += count


def _deliver(handler: PortHandler, rank: int | None, bodies: list, is_exc: bool) -> None:
    """Unpickle a value sent to ``handler``'s port and hand it over, here (the thread that read
    it: often an event loop) unless it may wait as it unpickles (``_off_loop``)."""
    if (
        WAITING_GLOBALS
        and (_ports_off_loop or may_wait(bodies))  # (most values: no further call)
        and _off_loop(handler, rank, bodies, is_exc)
    ):
        return
    _unpickle_and_deliver(handler, rank, bodies, is_exc)


def _unpickle_and_deliver(handler: PortHandler, rank: int | None, bodies: list, is_exc: bool) -> None:
    try:
        value = payload.loads(bodies)
    except Exception as e:
        value, is_exc = _not_unpickled(handler, e, is_exc), True
    handler.deliver(rank, value, is_exc)


def _not_unpickled(handler: PortHandler, error: BaseException, is_exc: bool) -> ActorError:
    """What the receiver gets for a value that could not be unpickled: an error saying why."""
    what = "an exception" if is_exc else "a value"
    return ActorError(
        error, f"The reply to {handler.label}() carried {what} that could not be unpickled here."
    )


def _off_loop(handler: PortHandler, rank: int | None, bodies: list, is_exc: bool) -> bool:
    """Whether a thread unpickles and hands over this value: it may wait as it unpickles (for
    minutes: it must not block the loop that read it, nor the other ports' values), or it was
    sent after such a value to the same port, still being unpickled (it goes after that one).
    That thread's own failure to start is handed over as this value's error."""
    port_id = handler.port_id
    if port_id not in _ports_off_loop and not may_wait(bodies):
        return False
    with _off_loop_lock:
        queued = _ports_off_loop.get(port_id)
        if queued is not None:
            queued.append((rank, bodies, is_exc))
            return True
        if not may_wait(bodies):  # the value it was sent after was handed over meanwhile
            return False
        queued = _ports_off_loop[port_id] = collections.deque([(rank, bodies, is_exc)])
        try:
            start_thread(lambda: _deliver_in_order(handler, queued), f"monarch-unpickle-port-{port_id}")
            return True
        except RuntimeError as e:
            del _ports_off_loop[port_id]
            failure = _not_unpickled(handler, e, is_exc)
    handler.deliver(rank, failure, True)
    return True


def _deliver_in_order(handler: PortHandler, queued: collections.deque[tuple[int | None, list, bool]]) -> None:
    """(a thread of its own) Unpickle and hand over the values ``queued`` for ``handler``'s port,
    in the order sent, until none is left; then later values are unpickled where they are read."""
    port_id = handler.port_id
    while True:
        with _off_loop_lock:
            if not queued:
                del _ports_off_loop[port_id]
                return
            rank, bodies, is_exc = queued.popleft()
        if handler_of(port_id) is not handler:
            continue  # receiver gone, or done: dropped, as for a frame (see handle_port_frame)
        try:
            _unpickle_and_deliver(handler, rank, bodies, is_exc)
        except Exception:  # as the runtime's dispatch does for a handler that raises
            logger.exception("handing over a value sent to %s() failed", handler.label)


class Port(Generic[R]):
    """The sending end of a channel; picklable, so it can be handed to any actor."""

    __slots__ = ("_address", "_port_id", "_rank", "_once")

    def __init__(self, address: str, port_id: int, rank: int | None = None, once: bool = False) -> None:
        self._address = address
        self._port_id = port_id
        self._rank = rank
        self._once = once

    def send(self, obj: R) -> None:
        """Send ``obj`` to the receiver (fire-and-forget, in order)."""
        self._post(obj, 0)

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's ``recv()`` raise ``exc``."""
        self._post(exc, FLAG_EXCEPTION)

    def _post(self, obj: Any, flags: int) -> None:
        if self._port_id == 0:
            return  # a dropping port (no reply expected)
        rt = runtime()
        if self._address == rt.address and payload.needs_no_copy(obj):
            # To a receiver in this process, an immutable value goes as it is, from this thread.
            handler = _handlers.get(self._port_id) or _receiver(self._port_id)
            if handler is None:
                return  # receiver gone, as for a frame (see handle_port_frame)
            if not handler.raw_frames and not (_ports_off_loop and self._port_id in _ports_off_loop):
                # (A port whose earlier values are still unpickled off the loop: pickled, behind them.)
                handler.deliver(self._rank, obj, bool(flags & FLAG_EXCEPTION))
                return
        if flags:
            rt.send(self._address, port_value(self._port_id, self._rank, flags), payload.dumps(obj))
            return
        template = _value_templates.get(self._rank)
        if template is None:
            template = _value_templates[self._rank] = HeaderTemplate(port_value(0, self._rank, 0), PORT_ID)
        rt.send_templated(self._address, template, self._port_id, payload.dumps(obj))

    def reply_to(self) -> list[Any]:
        """Internal: ``[process address, port id]``, the reply-port field of a message header."""
        return [self._address, self._port_id]

    def _with_rank(self, rank: int) -> Port[R]:
        return Port(self._address, self._port_id, rank, self._once)

    def __reduce__(self) -> Any:
        return (Port, (self._address, self._port_id, self._rank, self._once))

    def __repr__(self) -> str:
        return f"Port({self._address}#{self._port_id})"


DROPPING_PORT: Port[Any] = Port("", 0)
#: The header of a value sent to a port, by the rank it is from; only the port id differs.
_value_templates: dict[int | None, HeaderTemplate] = {}


def port_receiver(port: Port[Any]) -> PortReceiver[Any] | None:
    """The receiver behind ``port`` if it lives in this process."""
    if port._address != runtime().address:
        return None
    return _receiver(port._port_id)


class PortReceiver(PortHandler, Generic[R]):
    """The receiving end of a channel: ``recv()`` returns a Future of the next message."""

    def __init__(self, ranked: bool = False) -> None:
        self._lock = threading.Lock()
        self._values: collections.deque[tuple[int | None, Any, bool]] = collections.deque()
        self._waiters: collections.deque[Future[Any]] = collections.deque()
        self._ranked = ranked
        self._failure: BaseException | None = None
        self.label = "port"
        self.port_id = port_id = next(_port_ids)
        _receivers[port_id] = weakref.ref(self, lambda _: _receivers.pop(port_id, None))

    def close(self) -> None:
        """Stop receiving: what is sent to this port from now on is dropped."""
        _receivers.pop(self.port_id, None)
        _waited.discard(self)

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        """Hand an arrived message to the oldest pending ``recv()``, or keep it for the next one."""
        with self._lock:
            if not self._waiters:
                self._values.append((rank, value, is_exception))
                return
            fut = self._waiters.popleft()
            if not self._waiters:
                _waited.discard(self)
        self._resolve(fut, rank, value, is_exception)

    def fail(self, exc: BaseException) -> None:
        """A process expected to send here died: pending and later empty receives raise."""
        with self._lock:
            self._failure = exc
            waiters, self._waiters = self._waiters, collections.deque()
            _waited.discard(self)
        for fut in waiters:
            set_exception(fut, exc)

    def expect_from(self, addresses: Iterable[str]) -> None:
        """Add ``addresses`` to the processes whose death fails this receiver (it may wait on several)."""
        super().expect_from(set(addresses) | set(self._addresses))

    def _resolve(self, fut: Future[Any], rank: int | None, value: Any, is_exception: bool) -> None:
        if is_exception:
            set_exception(fut, value)
        elif self._ranked:
            set_result(fut, (rank, value))
        else:
            set_result(fut, value)

    def recv(self) -> Future[R]:
        """A Future of the next message, in the order sent; it raises what the sender passed to
        ``Port.exception``, or a ``SupervisionError`` if a process expected to send has died."""
        fut: Future[R] = pending_future()
        with self._lock:
            if not self._values:
                if self._failure is not None:
                    set_exception(fut, self._failure)
                else:
                    self._waiters.append(fut)
                    _waited.add(self)
                return fut
            rank, value, is_exc = self._values.popleft()
        self._resolve(fut, rank, value, is_exc)
        return fut

    def ranked(self) -> PortReceiver[tuple[int, R]]:
        """From now on deliver each message as ``(rank, value)``, to tell apart what several actors sent."""
        self._ranked = True
        return self  # type: ignore[return-value]


class Channel(Generic[R]):
    """Factory for a (Port, PortReceiver) pair owned by the current process."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        """A new channel into this process: hand the ``Port`` to other actors, read with the receiver."""
        receiver: PortReceiver[R] = PortReceiver()
        return Port(runtime().address, receiver.port_id, None, once), receiver

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], PortReceiver[tuple[int, R]]]:
        """Like ``open``, but each message arrives as ``(rank, value)``, the rank of the actor that sent it."""
        receiver: PortReceiver[Any] = PortReceiver(ranked=True)
        return Port(runtime().address, receiver.port_id, None, once), receiver
