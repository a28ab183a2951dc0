"""Frames for the actors of this process: the handlers the actor layer installs on the router.

``install`` hooks them into a runtime (``process_state`` calls it for every new runtime, before
it accepts a connection). A spawn creates the actor's mailbox; a message goes to its actor's
mailbox, or waits (bounded) for a spawn that a message overtook, or fails at once for an actor
stopped here; a stop request stops one actor, a process stop every actor and then the process.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING

from monarch._src.actor import log_forwarding, log_prefix, multicast, port, supervision, undelivered
from monarch._src.actor.context import extent_of
from monarch._src.actor.errors import SupervisionError
from monarch._src.actor.future import set_blocking_wait_hook, set_loop_thread, set_thread_wait_hook
from monarch._src.actor.instance import (
    MESSAGE,
    STOP,
    ActorInstance,
    CreatorInstance,
    cleanup_timeout,
    unrun_report,
)
from monarch._src.actor.port import Port
from monarch._src.actor.process_state import logger, runtime, this_process
from monarch._src.mesh.point import Point
from monarch._src.runtime import framework_log
from monarch._src.wire import payload, protocol
from monarch._src.wire.protocol import (
    ACTOR,
    ADDRESSES,
    BOOT,
    CREATOR,
    ENDPOINT,
    EXTENT,
    NAME,
    OWNER,
    RANK,
    REPLY_PORT,
    SEQUENCE,
    TIMEOUT,
)

if TYPE_CHECKING:
    from monarch._src.runtime.runtime import Runtime

#: How long a message waits for the spawn of its actor, when it overtook that spawn.
EARLY_MESSAGE_TIMEOUT_S = 30.0


def install(rt: Runtime) -> None:
    """Route the actor layer's frames of ``rt`` here, and its lost peers and frames to supervision."""
    if not this_process.is_worker:
        framework_log.setup_client()  # a worker's bootstrap set up its own already
    log_prefix.install()

    rt.register(protocol.MSG_KIND, handle_message, queues_only=True)
    rt.register(protocol.SPAWN_KIND, handle_spawn)
    rt.register(protocol.PORT_KIND, port.handle_port_frame)
    rt.register(protocol.PORT_BATCH_KIND, port.handle_port_batch)
    rt.register(protocol.FORWARD_KIND, multicast.handle_forward)
    rt.register(protocol.STOP_ACTOR_KIND, handle_stop_actor)
    rt.register(protocol.STOP_PROC_KIND, handle_stop_proc)
    rt.register(protocol.SUPERVISION_KIND, supervision.handle_supervision_frame)
    rt.register(protocol.LOG_KIND, log_forwarding.handle_log)
    rt.register(protocol.LOG_FLUSH_KIND, log_forwarding.handle_log_flush)
    rt.register(protocol.LOG_OPTION_KIND, log_forwarding.handle_log_option)
    rt.register(protocol.MESSAGES_LOST_KIND, undelivered.messages_lost)
    rt.on_peer_lost(supervision.peer_lost)
    rt.on_undeliverable(undelivered.message_rejected)
    rt.on_frames_lost(undelivered.connection_lost)
    rt.on_replies_lost(undelivered.replies_lost)
    set_loop_thread(rt.loop_thread.ident)
    set_blocking_wait_hook(rt.loop_replies.before_blocking_wait)
    set_thread_wait_hook(rt.thread_replies.of_this_thread)
    if not this_process.is_worker:
        supervision.install_sigint_wrapper()


def handle_spawn(header: dict, bodies: list) -> None:
    """Create the actor's mailbox now, so messages that follow the spawn find it."""
    labels, sizes = header[EXTENT]
    creator = header.get(CREATOR)
    try:
        cls, args, kwargs = payload.loads(bodies)
        init: tuple = (cls, args, kwargs)
    except Exception as e:
        cls, init = None, (None, e, None)
    inst = ActorInstance(
        key=header[ACTOR],
        name=header[NAME],
        cls=cls,
        rank=Point(header[RANK], extent_of(labels, sizes)),
        proc_addresses=tuple(header[ADDRESSES]),
        creator=CreatorInstance(*creator) if creator else None,
        owner=tuple(header[OWNER]) if header.get(OWNER) else None,  # type: ignore[arg-type]
    )
    inst.enqueue_init(init)
    with this_process.early_lock:
        this_process.register_actor(inst)
        if this_process.early:
            _release_early(inst)
    if header.get(BOOT):
        inst.start()  # the bootstrap actor is what the readiness gate waits for
    else:
        this_process.when_ready(inst.start)


def handle_message(header: dict, bodies: list) -> None:
    """To the actor's mailbox; held for a spawn it overtook; failed for an actor stopped here."""
    if SEQUENCE in header:  # handled again, without it, in its sender's order
        multicast.in_order(header, bodies, handle_message)
        return
    key = header[ACTOR]
    inst = this_process.actors.get(key)  # ``lookup`` without a call: once a message
    if inst is None and key in this_process.on_demand_actors:
        this_process.on_demand_actors[key]()
        inst = this_process.lookup(key)
    if inst is None:
        with this_process.early_lock:
            inst = this_process.lookup(key)  # the spawn may have landed meanwhile
            if inst is None and key not in this_process.gone:
                held = this_process.early.get(key)
                if held is None:
                    held = this_process.early[key] = []
                    rt = runtime()
                    rt.loop_thread.call_soon(rt.loop.call_later, EARLY_MESSAGE_TIMEOUT_S, _expire_early, key)
                held.append((header, bodies))
                return
        if inst is None:
            gone = this_process.gone.get(key)
            _reject(header, gone[4] if gone is not None else "it was stopped")
            return
    inst.put((MESSAGE, header, bodies))


def _reject(header: dict, why: str) -> None:
    """A message for an actor that is not here: the caller gets the error; for a broadcast,
    the owner of the stopped actor is told (one that never arrived has nobody to tell but the log)."""
    spec = header.get(REPLY_PORT)
    what = f"no actor {header[ACTOR]} in process {os.getpid()} ({why})"
    if spec:
        Port(spec[0], spec[1], header.get(RANK)).exception(
            SupervisionError(f"Endpoint call {header[ENDPOINT]}() failed, {what}")
        )
        return
    gone = this_process.gone.get(header[ACTOR])
    if gone is None:
        logger.error("a broadcast of endpoint %s() was not run: %s", header[ENDPOINT], what)
        sys.stderr.write(f"monarch: a broadcast of endpoint {header[ENDPOINT]}() was not run: {what}\n")
        return
    owner, name, rank, description, _ = gone
    supervision.report_stopped(
        owner, header[ACTOR], name, rank, unrun_report(description, [header[ENDPOINT]])
    )


def _expire_early(key: str) -> None:
    with this_process.early_lock:
        held = this_process.early.pop(key, None)
    for header, _ in held or ():
        _reject(header, f"it was not spawned here within {EARLY_MESSAGE_TIMEOUT_S:.0f} s")


def _release_early(inst: ActorInstance) -> None:
    """Queue the messages that arrived before this actor's spawn, in order (lock held)."""
    for header, bodies in this_process.early.pop(inst.key, None) or ():
        inst.put((MESSAGE, header, bodies))


def handle_stop_actor(header: dict, bodies: list) -> None:
    """Stop after the messages queued before this; past the sender's bound ("t" seconds) the
    sender is told what the actor is still running instead of waiting for it (runs on the loop)."""
    if SEQUENCE in header:  # handled again, without it, in its sender's order
        multicast.in_order(header, bodies, handle_stop_actor)
        return
    inst = this_process.lookup(header[ACTOR])
    if inst is None:
        spec = header.get(REPLY_PORT)
        if spec:
            ack: Port[None] = Port(spec[0], spec[1], header.get(RANK))  # the stop is acknowledged, no value
            ack.send(None)
        return
    timeout = header.get(TIMEOUT)
    if timeout is not None and header.get(REPLY_PORT):
        # (by weak reference: an actor that stopped in time is not kept until the timer is due)
        runtime().loop.call_later(timeout, _stop_overdue, weakref.ref(inst), header, timeout)
    inst.put((STOP, header, bodies))


def _stop_overdue(inst: weakref.ref[ActorInstance], header: dict, timeout: float) -> None:
    alive = inst()
    if alive is not None:  # (gone: it stopped, and answered the stop)
        alive.stop_overdue(header, timeout)


def handle_stop_proc(header: dict, bodies: list) -> None:
    """Stop every actor of this process at once (queued messages are not run; each actor
    reports itself stopped), then exit; after ``cleanup_timeout_s`` exit anyway, telling each
    owner whose ``__cleanup__`` did not run and why."""
    insts = this_process.all_actors()
    if not insts:
        this_process.request_exit()
        return
    for inst in insts:  # first, should this process be killed before its actors have stopped
        supervision.process_stopping(inst)
    remaining = [len(insts)]
    lock = threading.Lock()

    def one_done() -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            this_process.request_exit()

    timeout = cleanup_timeout()

    def overdue() -> None:
        for inst in insts:
            if not inst.stopped:
                supervision.actor_stopped(
                    inst,
                    f"{inst.activity()} when its process stopped: its __cleanup__ did not run, "
                    f"the process exited after waiting {timeout:g} s (MONARCH_CLEANUP_TIMEOUT_S).",
                )
        this_process.request_exit()

    rt = runtime()
    rt.loop_thread.call_soon(rt.loop.call_later, timeout, overdue)
    for inst in insts:
        inst.stop_now(one_done)
