"""Messages that cannot be delivered are reported to whoever waits for them, never dropped.

A message can fail to arrive in three ways. The receiving process may reject it (larger than
its ``MONARCH_MAX_FRAME_BYTES``, no memory for it, its shared-memory buffer gone): it then
answers the message's reply port with the error, or, for a message nobody waits on (a
broadcast), reports a failure of the receiving actor to its owner.

Or the connection it travelled on may close while the peer lives on, in either direction (each
process sends on a connection of its own). Messages the connection never wholly wrote are not
lost: they go first on the new connection, in order, and calls waiting on them complete. Of
those it wrote, calls whose messages, or whose replies, may have been lost fail with a
``ConnectionError`` (the peer says on reconnecting which replies it had written; calls still
running there complete), and failure reports are delivered again; a frame the drop cut off at
the receiver is rejected as above, unless the sender's hello shows it is sent again.

A connection that drops also loses what both kernels held of it: the sender keeps what it wrote
until the receiver says it read it, and sends again what was not read, but only within bounds
(``MONARCH_RESEND_KEEP_*``). It records where the frames it forgot unread were going, and the
receiver reports those lost as it reports a broadcast it rejected (``messages_lost``).

Or the peer's process is gone (or stayed unreachable): calls waiting on it fail with its loss
(``supervision.process_exited``) and the owners of the actors it ran hear of its death, which
also stands for the broadcasts it never got; what was never sent to it is logged by the
runtime, as no one is left to tell (its replies' callers and its own actors died with it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from monarch._src.actor import port, supervision
from monarch._src.actor.process_state import this_process
from monarch._src.wire import protocol
from monarch._src.wire.protocol import (
    ACTOR,
    ENDPOINT,
    KIND,
    LOST,
    MSG_KIND,
    PORT_ID,
    PORT_KIND,
    RANK,
    REPLY_PORT,
    REPORT,
    SENDER,
    UNCERTAIN,
)

logger = logging.getLogger("monarch.actor")


def message_rejected(header: dict, error: BaseException) -> None:
    """(receiving process) ``header``'s message could not be delivered because of ``error``."""
    kind = header.get(KIND)
    if kind == PORT_KIND:  # a reply to this very process: its receiver is here
        handler = port.handler_of(header.get(PORT_ID))
        if handler is not None:
            handler.deliver(header.get(RANK), error, True)
        return
    spec = header.get(REPLY_PORT)
    if isinstance(spec, list) and len(spec) == 2:
        port.Port(spec[0], spec[1], header.get(RANK)).exception(error)
        return
    inst = this_process.lookup(header.get(ACTOR)) if kind == MSG_KIND else None  # type: ignore[arg-type]
    if inst is not None:
        supervision.actor_failed(
            inst,
            f"The actor {inst.name}[{inst.rank.rank}] could not receive a message for its endpoint "
            f"{header.get(ENDPOINT)}(): {error}",
        )
        return
    logger.error("dropped an undeliverable message of kind %r: %s", kind, error)


def messages_lost(header: dict, bodies: list) -> None:
    """(receiving process) A live peer wrote messages to this process that it never read and
    the peer no longer kept to send again (a MESSAGES_LOST frame says where they were going):
    each actor they were for fails, and its owner hears how many it lost and why; every actor
    of this process may be among those the peer did not record the destination of."""
    sender, why = header.get(SENDER), header.get(REPORT)
    verb = "may not have received" if header.get(UNCERTAIN) else "never received"
    lost = header.get(LOST) or []
    unrecorded = sum(count for where, count in lost if where is None)
    more = (
        f", and maybe some of {unrecorded} more, whose actors {sender} did not record" if unrecorded else ""
    )
    told = set()
    for where, count in lost:
        if where is None:
            continue
        inst = this_process.lookup(where) if where.__class__ is str else None
        if inst is None:
            logger.error(
                "this process %s %d messages %s sent by %s: %s", verb, count, _for_whom(where), sender, why
            )
            continue
        told.add(id(inst))
        supervision.actor_failed(
            inst,
            f"The actor {inst.name}[{inst.rank.rank}] {verb} {count} messages sent to it by {sender}{more}: {why}",
        )
    if unrecorded:
        for each in this_process.all_actors():
            if id(each) not in told:
                supervision.actor_failed(
                    each,
                    f"The actor {each.name}[{each.rank.rank}] {verb} some of {unrecorded} messages "
                    f"{sender} sent to this process (it did not record which actors they were "
                    f"for): {why}",
                )


def _for_whom(destination: object) -> str:
    """A MESSAGES_LOST destination that is no actor of this process, for people."""
    if destination.__class__ is int:
        names = {v: k for k, v in vars(protocol).items() if k.endswith("_KIND")}
        return f"of kind {names.get(destination, destination)}"
    return f"for actor {destination}, which is not here any more"


def connection_lost(
    address: str, reason: BaseException, replies: bool
) -> Callable[[frozenset[int]], None] | None:
    """A connection with ``address`` closed with messages on it: this process's calls to it, or
    (``replies``) its replies to this process, when which of them were lost cannot be known.
    Returns what to do if the process there turns out to be alive: fail the calls that were
    waiting on it, and still are by then, but those on the ports it is told (their messages
    had not left this process: they went on the new connection) (None: none were waiting)."""
    waiting = port.waiting_on(address)
    if not waiting:
        return None

    def peer_alive(resent: frozenset[int]) -> None:
        still = set(port.waiting_on(address))
        for handler in waiting:
            if handler in still and handler.port_id not in resent:
                _fail_lost(handler, address, reason, replies)

    return peer_alive


def replies_lost(address: str, reason: BaseException, port_ids: list[int]) -> None:
    """The process at ``address``, alive, had sent replies to ``port_ids`` on a connection that
    closed before this process read them: their receivers fail (calls whose replies were not
    sent yet are untouched: the replies come on the new connection)."""
    for port_id in port_ids:
        handler = port.handler_of(port_id)
        if handler is not None:
            _fail_lost(handler, address, reason, True)


def _fail_lost(handler: port.PortHandler, address: str, reason: BaseException, reply: bool) -> None:
    if reply:
        what = f"the connection from {address} closed ({reason}) before its reply was known to be delivered"
    else:
        what = f"the connection to {address} closed ({reason}) before its message was known to be delivered"
    handler.stop_expecting()
    handler.fail(
        ConnectionError(
            f"Endpoint call {handler.label}() failed: {what}. The process is still "
            "alive, so the call may or may not have run.\n"
            "HINT: retry the call if it is safe to run twice."
        )
    )
