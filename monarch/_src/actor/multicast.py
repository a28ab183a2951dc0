"""Tree multicast: a message to a mesh that spans hosts costs its sender one frame per host.

A process that spawned procs on hosts run by agents knows, for each such proc, the *forwarder*
on its host (that host's session, ``host/session.py``, a process of this job). ``send`` groups
a message's destinations by forwarder: a host with two or more of them gets one FORWARD frame,
which its forwarder sends on to each proc over local sockets; the others are sent directly. For
``call()`` the forwarder also gathers its procs' replies and sends them back as one PORT_BATCH
frame once all are in; an exception is passed on at once (it fails the caller's future, as it
always did), and so is a proc's death (the caller also hears of it from the proc's exit report,
so neither waits on a dead rank).

Order. A sender's messages to one proc may now take two paths (direct, or through the
forwarder), and a later direct message could overtake an earlier forwarded one. So every
actor-bound frame (MSG, STOP_ACTOR) from this process to a proc reachable through a forwarder
carries ``SEQUENCE`` = ``[sender, n]``, numbered per (sender, proc), and the receiving proc
restores the order (``in_order``). Sequence numbers rather than "one path per sender and host"
keep point-to-point calls (``call_one``, ``choose``, replies) direct, without a detour through
the forwarder. A frame that never arrives (its connection dropped; its sender was told) holds
the ones behind it for at most ``GAP_TIMEOUT_S``, after which they are delivered anyway.

Processes that never spawned on agent hosts (every single-host program, and actors given a
mesh by reference) have no forwarders and keep the direct path untouched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from monarch._src.actor.errors import SupervisionError
from monarch._src.actor.port import PortHandler
from monarch._src.actor.process_state import runtime
from monarch._src.actor.undelivered import message_rejected
from monarch._src.wire.protocol import (
    ACTOR,
    ENDPOINT,
    EXTENT,
    FLAG_EXCEPTION,
    FLAGS,
    GATHER,
    RANK,
    REPLY_PORT,
    SENDER,
    SEQUENCE,
    TARGETS,
    forward,
    message,
    port_batch,
    port_value,
)

logger = logging.getLogger("monarch.actor")

#: How long frames wait behind one that has not arrived before they are delivered anyway.
GAP_TIMEOUT_S = 5.0

Handler = Callable[[dict, list], None]

_lock = threading.Lock()
#: proc address -> the forwarder on its host. Read without the lock on every send.
forwarders: dict[str, str] = {}
#: proc address -> the sequence number of this process's next actor-bound frame to it.
_next_seq: dict[str, int] = {}


def add_host(forwarder: str, procs: Iterable[str]) -> None:
    """``procs`` run on the host whose forwarder is at ``forwarder``."""
    with _lock:
        for address in procs:
            forwarders[address] = forwarder
            _next_seq.setdefault(address, 0)


def forget(procs: Iterable[str]) -> None:
    """These procs are gone: nothing more is sent to them."""
    with _lock:
        for address in procs:
            forwarders.pop(address, None)
            _next_seq.pop(address, None)


def forwarders_of(procs: Iterable[str]) -> list[str]:
    """The forwarders a multicast to ``procs`` passes through (those of the hosts with two or
    more of them): a call waiting on its replies must fail if one of them is lost."""
    seen: set[str] = set()
    used = []
    for f in map(forwarders.get, procs):
        if f is not None:
            if f in seen and f not in used:
                used.append(f)
            seen.add(f)
    return used


def _take(addresses: list[str]) -> list[int]:
    with _lock:
        numbers = []
        for address in addresses:
            n = _next_seq.get(address, 0)
            _next_seq[address] = n + 1
            numbers.append(n)
        return numbers


def _give_back(addresses: list[str], numbers: list[int]) -> None:
    """A frame numbered ``numbers`` was never sent (it raised): unless a later one was
    numbered meanwhile, reuse the numbers, so nothing waits for the frame at its receivers."""
    with _lock:
        for address, n in zip(addresses, numbers):
            if _next_seq.get(address) == n + 1:
                _next_seq[address] = n


def stamp(address: str, header: dict) -> None:
    """Number an actor-bound frame for ``address`` if that proc is reachable through a forwarder."""
    if address in forwarders:
        header[SEQUENCE] = [runtime().address, _take([address])[0]]


def send(
    dests: list[tuple[int, str]],
    actor: str,
    endpoint: str,
    reply: list | None,
    extent: list,
    bodies: list,
    gather: bool,
) -> None:
    """Send a MSG to every ``(rank, address)``: one frame per host that has two or more of
    them (gathering the replies there if ``gather``), the rest directly; all numbered."""
    rt = runtime()
    me = rt.address
    by_host: dict[str, list[tuple[int, str]]] = {}
    for rank, address in dests:
        f = forwarders.get(address)
        if f is None:
            rt.send(address, message(actor, endpoint, reply, rank, extent), bodies)
        else:
            by_host.setdefault(f, []).append((rank, address))
    for f, targets in by_host.items():
        addresses = [a for _, a in targets]
        numbers = _take(addresses)
        try:
            if len(targets) == 1:
                rank, address = targets[0]
                header = message(actor, endpoint, reply, rank, extent)
                header[SEQUENCE] = [me, numbers[0]]
                rt.send(address, header, bodies)
            else:
                wire = [[rank, a, n] for (rank, a), n in zip(targets, numbers)]
                rt.send(
                    f, forward(actor, endpoint, reply, extent, wire, me, gather and reply is not None), bodies
                )
        except BaseException:
            _give_back(addresses, numbers)
            raise


# -- the forwarder's side ------------------------------------------------------------------------


def handle_forward(header: dict, bodies: list) -> None:
    """Send the message on to each target proc on this host (see the module doc)."""
    rt = runtime()
    targets = header[TARGETS]
    reply = header[REPLY_PORT]
    if reply and header.get(GATHER):
        gathered = HostGather(reply, len(targets), header[ENDPOINT])
        gathered.expect_from([a for _, a, _ in targets])
        reply = [rt.address, gathered.port_id]
    actor, endpoint, extent, sender = header[ACTOR], header[ENDPOINT], header[EXTENT], header[SENDER]
    for rank, address, n in targets:
        out = message(actor, endpoint, reply, rank, extent)
        out[SEQUENCE] = [sender, n]
        try:
            rt.send(address, out, bodies)
        except Exception as e:  # (this runtime shut down, say) its caller must not wait for it
            message_rejected(out, e)


class HostGather(PortHandler):
    """On a forwarder: its procs' replies to one ``call()``, sent back as one frame."""

    raw_frames = True

    def __init__(self, reply: list, count: int, endpoint: str) -> None:
        self.label = endpoint
        self._reply = reply
        self._count = count
        self._ranks: list[list[int]] = []
        self._bodies: list[Any] = []
        self._lock = threading.Lock()
        self.open()

    def deliver_frame(self, header: dict, bodies: list) -> None:
        address, port_id = self._reply
        if header.get(FLAGS, 0) & FLAG_EXCEPTION:  # fails the call: pass it on now
            self._done()
            runtime().send(address, port_value(port_id, header.get(RANK), FLAG_EXCEPTION), bodies)
            return
        with self._lock:
            self._ranks.append([header.get(RANK), len(bodies)])  # type: ignore[list-item]
            self._bodies += bodies
            complete = len(self._ranks) == self._count
        if complete:
            self._done()
            runtime().send(address, port_batch(port_id, self._ranks), self._bodies)

    def fail(self, exc: BaseException) -> None:
        """A proc of this call died, or a connection to one closed: gathering ends. The caller
        (who spawned these procs, or it would not know this forwarder) hears of a death from
        the proc's exit report, which names its call and rank; of anything else, from here."""
        from monarch._src.wire import payload  # only on this failure path

        self._done()
        if isinstance(exc, SupervisionError):
            return
        address, port_id = self._reply
        runtime().send(address, port_value(port_id, None, FLAG_EXCEPTION), payload.dumps(exc))

    def _done(self) -> None:
        self.close()
        self.stop_expecting()


# -- the receiver's side: restoring each sender's order -------------------------------------------

#: sender address -> the number of the next frame to deliver from it.
_expected: dict[str, int] = {}
#: sender address -> frames from it that arrived ahead of their turn, by number.
_held: dict[str, dict[int, tuple[dict, list, Handler]]] = {}


def in_order(header: dict, bodies: list, handler: Handler) -> None:
    """Run ``handler`` on this numbered frame, and on those held behind it, in the sender's
    order (frames arrive on the loop thread, so handlers run in that order), each without
    its number."""
    sender, n = header.pop(SEQUENCE)
    with _lock:
        expected = _expected.get(sender, 0)
        if n > expected:
            held = _held.setdefault(sender, {})
            held[n] = (header, bodies, handler)
            if len(held) == 1:
                runtime().loop.call_later(GAP_TIMEOUT_S, _gap_overdue, sender, expected)
            return
        ready = [(header, bodies, handler)]
        if n == expected:
            ready += _release(sender, n + 1)
    for h, b, fn in ready:  # n < expected: it arrived after its gap was given up on
        fn(h, b)


def _release(sender: str, n: int) -> list[tuple[dict, list, Handler]]:
    """The held frames from ``n`` on without a gap; the next expected is after them (lock held)."""
    ready = []
    held = _held.get(sender)
    while held and n in held:
        ready.append(held.pop(n))
        n += 1
    if held is not None and not held:
        del _held[sender]
    _expected[sender] = n
    return ready


def _gap_overdue(sender: str, missing: int) -> None:
    """Frame ``missing`` from ``sender`` did not come: deliver what waits behind it."""
    with _lock:
        if _expected.get(sender, 0) != missing or not _held.get(sender):
            return
        first = min(_held[sender])
        ready = _release(sender, first)
        if _held.get(sender):
            runtime().loop.call_later(GAP_TIMEOUT_S, _gap_overdue, sender, _expected[sender])
    logger.warning(
        "frames %d..%d from %s never arrived within %g s; delivering the %d that followed them",
        missing,
        first - 1,
        sender,
        GAP_TIMEOUT_S,
        len(ready),
    )
    for h, b, fn in ready:
        fn(h, b)
