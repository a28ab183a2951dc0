"""This process as seen by the actor layer: its runtime, its actors, and the message handlers.

Importing this module registers a start hook on ``Runtime`` so that any runtime (the client's,
created lazily, or a worker's, created at bootstrap) routes actor messages, spawns, port
replies and stop requests to the actor layer.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from monarch._src.runtime.runtime import Runtime

if TYPE_CHECKING:
    from monarch._src.actor.instance import ActorInstance

logger = logging.getLogger("monarch.actor")

MSG_KIND = 1
SPAWN_KIND = 2
PORT_KIND = 3
STOP_ACTOR_KIND = 4
STOP_PROC_KIND = 5
SUPERVISION_KIND = 6
#: Output lines forwarded by a spawner to the process that asked for them (log_forwarding).
LOG_KIND = 7
#: Ask a worker to write a flush marker on its stdout and stderr.
LOG_FLUSH_KIND = 8
#: ``ProcMesh.logging_option`` applied by one worker (and, through its pipes, its spawner).
LOG_OPTION_KIND = 9

#: actor key -> the actor living in this process.
actors: dict[str, "ActorInstance"] = {}
actors_lock = threading.Lock()
#: Called (on the loop thread) when this worker is asked to exit.
exit_requested: list[Callable[[], None]] = []


def runtime() -> Runtime:
    rt = Runtime._instance
    return rt if rt is not None and not rt.closed else Runtime.get()


def _install(rt: Runtime) -> None:
    from monarch._src.actor import instance, log_forwarding, log_prefix, port, supervision
    from monarch._src.actor.future import set_loop_thread_probe
    from monarch._src.runtime import framework_log

    if not _is_worker:
        framework_log.setup_client()  # a worker's bootstrap set up its own already
    log_prefix.install()

    rt.register(MSG_KIND, instance.handle_message)
    rt.register(SPAWN_KIND, instance.handle_spawn)
    rt.register(PORT_KIND, port.handle_port_frame)
    rt.register(STOP_ACTOR_KIND, instance.handle_stop_actor)
    rt.register(STOP_PROC_KIND, instance.handle_stop_proc)
    rt.register(SUPERVISION_KIND, supervision.handle_supervision_frame)
    rt.register(LOG_KIND, log_forwarding.handle_log)
    rt.register(LOG_FLUSH_KIND, log_forwarding.handle_log_flush)
    rt.register(LOG_OPTION_KIND, log_forwarding.handle_log_option)
    rt.on_peer_lost(supervision.peer_lost)
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
    exit_requested.append(bootstrap.request_exit)
    if config.get("gated"):
        set_proc_ready(False)


Runtime.add_start_hook(_install)


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


def lookup(key: str) -> "ActorInstance | None":
    return actors.get(key)


def register_actor(inst: "ActorInstance") -> None:
    with actors_lock:
        actors[inst.key] = inst


def unregister_actor(key: str) -> None:
    with actors_lock:
        actors.pop(key, None)


def all_actors() -> list["ActorInstance"]:
    with actors_lock:
        return list(actors.values())


def send_control(address: str, kind: int, header: dict[str, Any], obj: Any = None) -> None:
    from monarch._src.wire import payload

    header["k"] = kind
    runtime().send(address, header, payload.dumps(obj) if obj is not None else [])
