"""This process as the actor layer sees it: its runtime, and one ``ProcessState`` object.

The actor layer and everything above it reach this process through two names of this module,
and only through them:

- ``runtime()``: this process's ``Runtime`` (the runtime layer keeps the one instance), started
  on first use in a client. The first call, or a worker's bootstrap (``on_worker_start``),
  hooks the actor layer's frame handlers into every runtime before it accepts a connection.
  The runtime module (and with it asyncio) is imported only then: ``import monarch.actor``
  stays fast. After ``retire_runtime()`` (the client was shut down) no runtime starts again.
- ``this_process``: the actor layer's state of this process (its actors, messages that came
  before their actor, the readiness gate, the exit callbacks), one ``ProcessState``.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch._src.actor.instance import ActorInstance
    from monarch._src.runtime.runtime import Runtime

logger = logging.getLogger("monarch.actor")

#: Actors stopped here whose late messages are still answered with the reason, at most this many.
GONE_LIMIT = 4096


class ProcessState:
    """The actor layer's state of this process; its one instance is ``this_process``."""

    def __init__(self) -> None:
        #: actor key -> the actor living in this process.
        self.actors: dict[str, ActorInstance] = {}
        self.actors_lock = threading.Lock()
        #: Actors this process creates on first use (e.g. the client's controller registry), by key.
        self.on_demand_actors: dict[str, Callable[[], None]] = {}
        #: Messages for actors whose spawn has not arrived yet: a mesh reference can travel by
        #: another route (another process) and overtake the spawn (see ``dispatch``).
        self.early: dict[str, list[tuple[dict, list]]] = {}
        #: Actors stopped here (bounded), by key, so that late messages fail at once and the
        #: owner hears of late broadcasts: key -> (owner, name, rank, description, why it is gone).
        self.gone: collections.OrderedDict[str, tuple[Any, str, int, str, str]] = collections.OrderedDict()
        #: Guards ``early`` and ``gone`` together with the registration of a spawned actor.
        self.early_lock = threading.Lock()
        #: The client's root actor, made on first use (``instance.root_instance``).
        self.root: ActorInstance | None = None
        self.root_lock = threading.Lock()
        #: Called (on the loop thread) when this worker is asked to exit.
        self.exit_requested: list[Callable[[], None]] = []
        self.is_worker = False
        #: The Runtime class once the actor layer's handlers are hooked into it.
        self.runtime_class: type[Runtime] | None = None
        #: Set by ``retire_runtime``: no runtime may start in this process any more.
        self.retired = False
        self.runtime_lock = threading.RLock()
        #: False while this worker's ``bootstrap`` function runs; spawns wait for it.
        self._ready = True
        #: What the spawn-time ``bootstrap`` function raised: no actor is constructed after it.
        self.boot_failure: BaseException | None = None
        self._ready_waiters: list[Callable[[], None]] = []

    # -- actors -----------------------------------------------------------------------------

    def lookup(self, key: str) -> ActorInstance | None:
        return self.actors.get(key)

    def register_actor(self, inst: ActorInstance) -> None:
        with self.actors_lock:
            self.actors[inst.key] = inst

    def unregister_actor(self, inst: ActorInstance) -> None:
        """``inst`` stopped: forget it, but remember why, for the messages still on their way."""
        with self.early_lock:  # first: a message that misses the actor finds why it is gone
            self.gone[inst.key] = (
                inst.owner,
                inst.name,
                inst.rank.rank,
                str(inst),
                inst.failure or "it was stopped",
            )
            while len(self.gone) > GONE_LIMIT:
                self.gone.popitem(last=False)
        with self.actors_lock:
            self.actors.pop(inst.key, None)

    def all_actors(self) -> list[ActorInstance]:
        with self.actors_lock:
            return list(self.actors.values())

    # -- readiness and exit -----------------------------------------------------------------

    def when_ready(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once this process's ``bootstrap`` function (if any) has finished."""
        with self.actors_lock:
            if not self._ready:
                self._ready_waiters.append(fn)
                return
        fn()

    def set_ready(self, ready: bool, boot_failure: BaseException | None = None) -> None:
        with self.actors_lock:
            self._ready = ready
            if boot_failure is not None:
                self.boot_failure = boot_failure
            waiters = list(self._ready_waiters) if ready else []
            if ready:
                self._ready_waiters.clear()
        for fn in waiters:
            fn()

    def request_exit(self) -> None:
        for cb in self.exit_requested:
            cb()


this_process = ProcessState()


def runtime() -> Runtime:
    """This process's runtime, started on first use in a client (the one way to reach it)."""
    cls = this_process.runtime_class
    rt = cls.current() if cls is not None else None
    if rt is not None and not rt.closed:
        return rt
    return _start_runtime()


def _start_runtime() -> Runtime:
    with this_process.runtime_lock:
        cls = _hook_runtime_class()
        rt = cls.current()
        if this_process.retired or (rt is not None and rt.closed):
            raise RuntimeError(
                "the monarch client of this process was shut down (shutdown_context()) and "
                "cannot be restarted in the same process.\nHINT: start a new process."
            )
        if rt is None:
            from monarch._src.runtime.runtime import new_client_runtime  # asyncio: only once used

            rt = new_client_runtime()
        return rt


def _hook_runtime_class() -> type[Runtime]:
    """The Runtime class, with the actor layer's handlers hooked into every instance."""
    cls = this_process.runtime_class
    if cls is None:
        from monarch._src.runtime.runtime import Runtime  # asyncio: only once a runtime is needed

        Runtime.add_start_hook(_install_handlers)
        cls = this_process.runtime_class = Runtime
    return cls


def _install_handlers(rt: Runtime) -> None:
    from monarch._src.actor import dispatch  # the handlers sit at the top of the module order

    dispatch.install(rt)


def retire_runtime() -> Runtime | None:
    """No runtime may start in this process any more (the client is shutting down); returns
    the one that runs, if any, for the caller to shut down."""
    with this_process.runtime_lock:
        this_process.retired = True
        cls = this_process.runtime_class
        return cls.current() if cls is not None else None


def on_worker_start(config: dict[str, Any]) -> None:
    """Called by the worker bootstrap before its runtime goes live."""
    from monarch._src.runtime import bootstrap  # only workers load it

    this_process.is_worker = True
    _hook_runtime_class()
    this_process.exit_requested.append(bootstrap.request_exit)
    if config.get("gated"):
        this_process.set_ready(False)
