"""This process as seen by the actor layer: its runtime, its actors, and the message handlers.

The first use of ``runtime()`` (or a worker's bootstrap) registers a start hook on ``Runtime``,
so that any runtime (the client's, created lazily, or a worker's) routes actor messages, spawns,
port replies and stop requests to the actor layer. The runtime module (and with it asyncio) is
imported only then: ``import monarch.actor`` stays fast.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch._src.actor.instance import ActorInstance
    from monarch._src.runtime.runtime import Runtime

logger = logging.getLogger("monarch.actor")

#: actor key -> the actor living in this process.
actors: dict[str, ActorInstance] = {}
actors_lock = threading.Lock()
#: Called (on the loop thread) when this worker is asked to exit.
exit_requested: list[Callable[[], None]] = []


_current: Runtime | None = None
_hooked = False
_RUNTIME_MODULE = "monarch._src.runtime.runtime"


def runtime() -> Runtime:
    """This process's runtime, started on first use in a client."""
    rt = _current
    if rt is not None and not rt.closed:
        return rt
    return _start_runtime()


_retired = False


def _start_runtime() -> Runtime:
    global _current
    if _retired:
        raise RuntimeError(
            "the monarch client of this process was shut down (shutdown_context()) and "
            "cannot be restarted in the same process.\nHINT: start a new process."
        )
    _current = runtime_class().get()
    return _current


def runtime_class() -> type[Runtime]:
    """The Runtime class, with the actor layer's handlers hooked into every instance."""
    global _hooked
    from monarch._src.runtime.runtime import Runtime

    if not _hooked:
        Runtime.add_start_hook(_install)
        _hooked = True
    return Runtime


def retire_runtime() -> None:
    """No runtime may start in this process any more (the client was shut down)."""
    global _retired
    _retired = True


def current_runtime() -> Runtime | None:
    """This process's runtime if one was started, without starting one."""
    module = sys.modules.get(_RUNTIME_MODULE)
    return module.Runtime.current() if module is not None else None  # type: ignore[attr-defined]


def _install(rt: Runtime) -> None:
    from monarch._src.actor import instance, log_forwarding, log_prefix, port, supervision, undelivered
    from monarch._src.actor.future import set_loop_thread_probe
    from monarch._src.runtime import framework_log
    from monarch._src.wire import protocol

    if not _is_worker:
        framework_log.setup_client()  # a worker's bootstrap set up its own already
    log_prefix.install()

    rt.register(protocol.MSG_KIND, instance.handle_message)
    rt.register(protocol.SPAWN_KIND, instance.handle_spawn)
    rt.register(protocol.PORT_KIND, port.handle_port_frame)
    rt.register(protocol.STOP_ACTOR_KIND, instance.handle_stop_actor)
    rt.register(protocol.STOP_PROC_KIND, instance.handle_stop_proc)
    rt.register(protocol.SUPERVISION_KIND, supervision.handle_supervision_frame)
    rt.register(protocol.LOG_KIND, log_forwarding.handle_log)
    rt.register(protocol.LOG_FLUSH_KIND, log_forwarding.handle_log_flush)
    rt.register(protocol.LOG_OPTION_KIND, log_forwarding.handle_log_option)
    rt.on_peer_lost(supervision.peer_lost)
    rt.on_undeliverable(undelivered.message_rejected)
    rt.on_frames_lost(undelivered.connection_lost)
    set_loop_thread_probe(lambda: rt.loop_thread.ident)
    if not _is_worker:
        supervision.install_sigint_wrapper()


_is_worker = False


def request_process_exit() -> None:
    for cb in exit_requested:
        cb()


def on_worker_start(config: dict[str, Any]) -> None:
    """Called by the worker bootstrap before its runtime goes live."""
    global _is_worker
    from monarch._src.runtime import bootstrap

    _is_worker = True
    runtime_class()
    exit_requested.append(bootstrap.request_exit)
    if config.get("gated"):
        set_proc_ready(False)


_ready = True
_ready_waiters: list[Callable[[], None]] = []


def when_proc_ready(fn: Callable[[], None]) -> None:
    """Run ``fn`` once this process's ``bootstrap`` function (if any) has finished."""
    with actors_lock:
        if not _ready:
            _ready_waiters.append(fn)
            return
    fn()


def set_proc_ready(ready: bool) -> None:
    global _ready
    with actors_lock:
        _ready = ready
        waiters = list(_ready_waiters) if ready else []
        if ready:
            _ready_waiters.clear()
    for fn in waiters:
        fn()


def lookup(key: str) -> ActorInstance | None:
    return actors.get(key)


def register_actor(inst: ActorInstance) -> None:
    with actors_lock:
        actors[inst.key] = inst


def unregister_actor(key: str) -> None:
    with actors_lock:
        actors.pop(key, None)


def all_actors() -> list[ActorInstance]:
    with actors_lock:
        return list(actors.values())
