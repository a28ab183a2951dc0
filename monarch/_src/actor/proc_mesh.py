"""``ProcMesh``: a mesh of processes that actors are spawned on; ``this_proc``; controllers."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from monarch._src.actor import multicast, supervision
from monarch._src.actor.actor import Actor, validate_actor_class
from monarch._src.actor.actor_mesh import ActorMesh, keep_while_referenced
from monarch._src.actor.collectors import StopCollector
from monarch._src.actor.context import context
from monarch._src.actor.coroutines import is_coroutine
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.future import (
    Future,
    add_done_callback,
    completed_future,
    outcome,
    pending_future,
    set_exception,
    set_result,
)
from monarch._src.actor.process_state import runtime, this_process
from monarch._src.mesh.extent import Extent
from monarch._src.mesh.mesh_trait import MeshTrait
from monarch._src.mesh.shape import Shape
from monarch._src.wire import payload, protocol

T = TypeVar("T")

ROOT_ADDRESS_ENV = "MONARCH_ROOT_ADDRESS"

#: Set by the host layer: ``host_mesh_factory(host)`` builds the HostMesh of one machine, given
#: as the host layer recorded it for a proc (``ProcMesh``'s ``hosts``); None: this machine.
host_mesh_factory: Callable[[Any], Any] | None = None

#: Set by the tensor layer (``monarch._src.tensor.hooks``, loaded by ``import monarch.actor``):
#: what ``activate`` and ``rank_tensor`` hand over to; None where no tensor layer is loaded.
tensor_engine: Any = None


class ProcOwner(Protocol):
    """What owns the OS processes of a ProcMesh (the host layer's process group).

    The mesh layer only stops its processes; a supervisor of processes (the launcher) also
    needs their pids, their exit statuses as they happen, and a hard kill: all of it through
    this protocol, so that it never depends on how the host layer keeps its processes.
    """

    def stop(self, reason: str) -> Future[None]: ...

    @property
    def stopped(self) -> bool: ...

    @property
    def pids(self) -> list[int]:
        """The OS pid of each process, by rank (0 for one that never started)."""
        ...

    def watch_exits(self, on_exit: Callable[[int, int], None]) -> None:
        """Call ``on_exit(rank, exit_code)`` for each process as it exits (at once for those
        already gone), on the runtime's loop thread; a rank may be reported twice."""
        ...

    def kill(self) -> None:
        """SIGKILL every process still running (and anything still forking them)."""
        ...


def proc_mesh_reference(addresses: tuple[str, ...], extent: Extent) -> ProcMesh:
    """A mesh of processes owned elsewhere (it can spawn, not stop), e.g. an actor's own."""
    return ProcMesh(addresses, Shape.from_extent(extent))


def owner_of(mesh: ProcMesh) -> ProcOwner | None:
    """What owns ``mesh``'s processes; None for a reference to processes owned elsewhere."""
    return mesh._owner


#: How long after the stop bound a rank that never answered is given up on (its process is
#: alive but its loop did not run the bound's timer).
STOP_ANSWER_GRACE_S = 2.0


def stop_actors(key: str, addresses: list[str], label: str = "mesh") -> Future[None]:
    """Ask each process to stop its actor of mesh ``key``; resolves when all have (or are gone),
    fails after ``actor_stop_timeout_s`` naming the ranks that have not."""
    from monarch._src.runtime.config import CONFIG

    rt = runtime()
    timeout = CONFIG.actor_stop_timeout_s

    def send(ranks: list[int]) -> None:
        for i in ranks:
            header = protocol.stop_actor(key, spec, i, timeout)
            multicast.stamp(addresses[i], header)  # after the messages sent before it, whatever their path
            rt.send(addresses[i], header, [])

    collector = StopCollector(addresses, label, timeout, send)
    collector.label = f"{label}.stop"
    collector.expect_from(addresses)
    spec = [rt.address, collector.port_id]
    send(list(range(len(addresses))))
    if addresses:
        rt.loop_thread.call_soon(rt.loop.call_later, timeout + STOP_ANSWER_GRACE_S, collector.overdue)
    return collector.future


class ProcMesh(MeshTrait):
    """Processes laid out on named dimensions; ``spawn`` puts one actor on each."""

    def __init__(
        self,
        addresses: tuple[str, ...],
        shape: Shape,
        owner: ProcOwner | None = None,
        hosts: tuple[Any, ...] | None = None,
        initialized: Future[Any] | None = None,
    ) -> None:
        self._addresses = addresses
        self._mesh_shape = shape
        self._owner = owner
        #: By base rank, the machine each proc runs on, as the host layer names it (travels
        #: with the mesh); None: procs this process spawned on its own machine.
        self._hosts = hosts
        self._initialized = initialized

    @property
    def _shape(self) -> Shape:
        return self._mesh_shape

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._addresses, shape, self._owner, self._hosts, self._initialized)

    def _proc_addresses(self) -> list[str]:
        addrs = self._addresses
        return [addrs[base] for base in self._mesh_shape.ranks()]

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> T:
        """Spawn one ``Class`` actor per process; returns at once (``__init__`` runs remotely,
        before any message sent to the new mesh)."""
        validate_actor_class(Class, args, kwargs)
        if self._owner is not None and self._owner.stopped:
            raise RuntimeError("`ProcMesh` has already been stopped")
        return self._spawn_nocheck(name, Class, args, kwargs)  # type: ignore[return-value]

    def _spawn_nocheck(
        self, name: str, Class: type, args: tuple, kwargs: dict, boot: bool = False
    ) -> ActorMesh[Any]:
        key = f"{name}-{uuid.uuid4().hex[:12]}"
        addrs = tuple(self._proc_addresses())
        ext = self._mesh_shape.extent
        wire_extent = [ext.labels, ext.sizes]
        spawner = context().actor_instance
        creator = spawner.as_creator()
        creator_wire = [creator.name, creator.actor_id, creator.description]
        bodies = payload.dumps((Class, args, kwargs))
        rt = runtime()
        owner = [rt.address, spawner.key]
        supervision.record_spawn(spawner.key, key, name, addrs)
        for i, address in enumerate(addrs):
            header = protocol.spawn(key, name, i, wire_extent, addrs, creator_wire, owner, boot)
            rt.send(address, header, bodies)
        mesh: ActorMesh[Any] = ActorMesh(Class, name, key, addrs, Shape.from_extent(ext))
        keep_while_referenced(mesh, self._owner)
        return mesh

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every process of this mesh (their actors run ``__cleanup__`` first)."""
        if self._owner is None:
            if self._addresses == (runtime().address,):
                raise RuntimeError("cannot stop the client's own process; use shutdown_context()")
            raise RuntimeError("cannot stop a `ProcMesh` that is a reference instead of owned")
        return self._owner.stop(reason)

    @property
    def initialized(self) -> Future[Any]:
        """Resolves once the processes are up and the spawn-time ``bootstrap`` ran on each."""
        return self._initialized if self._initialized is not None else completed_future(True)

    @property
    def host_mesh(self) -> Any:
        """The host mesh a one-process mesh runs on, to spawn more processes on the same host."""
        if len(self) != 1:
            raise NotImplementedError("host_mesh is only available on a single-process ProcMesh")
        if host_mesh_factory is None:
            raise RuntimeError("no host layer is loaded (import monarch.actor)")
        return host_mesh_factory(self._hosts[self._mesh_shape.ranks()[0]] if self._hosts else None)

    async def logging_option(
        self,
        stream_to_client: bool = True,
        aggregate_window_sec: int | float | None = 3,
        level: int = 20,  # logging.INFO
        prefix_with_rank: bool = False,
    ) -> None:
        """Forward this mesh's stdout/stderr to the calling process (the client), aggregated.

        ``stream_to_client``: send the workers' output here over monarch's own connections
        (False: back to the default, where each spawner shows it directly, unprefixed).
        ``aggregate_window_sec``: collapse similar lines (equal but for their numbers) seen
        within this many seconds into ``[N similar log lines] <line>``; None writes what is
        buffered and then shows lines as they come. ``level``: while streaming, Python
        ``logging`` records below it are disabled in the workers (``logging.disable``);
        printing is never filtered. ``prefix_with_rank`` (monarch-aio): start each forwarded
        line with the worker's rank, e.g. ``[gpus=1] ``. Returns once every worker applied it.
        """
        from monarch._src.actor import log_forwarding  # only once asked: import monarch.actor stays lean
        from monarch._src.mesh.point import Point

        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 255:
            raise ValueError(f"Invalid logging level: {level}")
        if aggregate_window_sec is not None and (
            isinstance(aggregate_window_sec, bool)
            or not isinstance(aggregate_window_sec, (int, float))
            or not aggregate_window_sec >= 0
        ):
            raise ValueError(
                f"Invalid aggregate_window_sec: {aggregate_window_sec!r} (a number >= 0, or None)"
            )
        stream = bool(stream_to_client)
        window = (
            None if aggregate_window_sec is None or aggregate_window_sec == 0 else float(aggregate_window_sec)
        )
        rt = runtime()
        mid = log_forwarding.mesh_log_id(self._addresses)
        addresses = self._proc_addresses()
        extent = self._mesh_shape.extent
        if stream:  # somewhere for the first lines to go before any worker sends them
            log_forwarding.prepare_client(mid, window)

        def header(reply: list, i: int) -> dict[str, Any]:
            prefix = None
            if prefix_with_rank:
                prefix = "[" + ",".join(f"{k}={v}" for k, v in Point(i, extent).items()) + "] "
            return protocol.log_option(reply, i, protocol.log_options(stream, rt.address, mid, level, prefix))

        await log_forwarding.ask_workers(addresses, header)
        # Every worker's output up to the switch has arrived: apply the client's half.
        log_forwarding.set_client_options(mid, stream, window)

    def proc_addresses(self) -> list[str]:
        """The address of each proc of this (sliced) mesh, by rank: the tensor engine reaches its
        per-proc workers through them."""
        return self._proc_addresses()

    @property
    def root_addresses(self) -> tuple[str, ...]:
        """Every proc of the mesh this one was sliced from (slices share it): one tensor engine
        serves them all, so tensors can move between slices."""
        return self._addresses

    def activate(self) -> Any:
        """A context manager: inside it, torch ops make distributed tensors on this mesh's procs."""
        return _tensor_engine().activate(self)

    def rank_tensor(self, dim: str | list[str]) -> Any:
        """A distributed int64 scalar: each proc's index along ``dim`` (several: row-major)."""
        return _tensor_engine().rank_tensor(self, dim)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    def __reduce__(self) -> Any:
        return (ProcMesh, (self._addresses, self._mesh_shape, None, self._hosts))

    def __repr__(self) -> str:
        return f"ProcMesh({self._mesh_shape.extent})"


def _tensor_engine() -> Any:
    if tensor_engine is None:
        raise RuntimeError(
            "the tensor engine is not loaded\nHINT: import monarch.actor (it installs the engine; torch is "
            "imported only once a mesh is activated)."
        )
    return tensor_engine


# -- spawn-time bootstrap ---------------------------------------------------------------------


class _SetupActor(Actor):
    """Runs a ProcMesh's ``bootstrap`` function before any user actor starts on the process."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._error: BaseException | None = None
        try:
            result = fn()
            if is_coroutine(result):
                import asyncio

                asyncio.run(result)
        except Exception as e:
            self._error = e
        finally:
            this_process.set_ready(True, self._error)

    @endpoint
    def result(self) -> bool:
        if self._error is not None:
            raise self._error
        return True


def run_bootstrap(mesh: ProcMesh, fn: Callable[[], Any]) -> Future[Any]:
    """Spawn the setup actor (exempt from the readiness gate); its reply is ``initialized``."""
    setup = mesh._spawn_nocheck("setup", _SetupActor, (fn,), {}, boot=True)
    done: Future[Any] = pending_future()

    def settle(reply: Future[Any]) -> None:
        _, exc = outcome(reply)
        if exc is not None:
            set_exception(done, exc)
        else:
            set_result(done, True)

    add_done_callback(setup.result.call(), settle)
    return done


# -- this_proc and controllers ------------------------------------------------------------------


def _register_on_demand() -> None:
    this_process.on_demand_actors[_REGISTRY_KEY] = _start_registry


def this_proc() -> ProcMesh:
    """The single process the calling actor (or the client) runs in."""
    return context().actor_instance.proc


def root_address() -> str:
    return os.environ.get(ROOT_ADDRESS_ENV) or runtime().address


class _ControllerRegistry(Actor):
    """Lives in the client: one instance of each named controller, whoever asks first."""

    def __init__(self) -> None:
        self._controllers: dict[str, Any] = {}

    @endpoint
    async def get_or_spawn(self, name: str, cls: type, args: tuple, kwargs: dict) -> Any:
        mesh = self._controllers.get(name)
        if mesh is None:
            mesh = self._controllers[name] = this_proc().spawn(name, cls, *args, **kwargs)
        return mesh


_REGISTRY_KEY = "__monarch_controllers__"
_registry_lock = threading.Lock()


def _start_registry() -> None:
    """Create the registry in the client the first time anyone (client or actor) asks."""
    from monarch._src.actor import dispatch  # above the meshes in the package's module order

    with _registry_lock:
        if this_process.lookup(_REGISTRY_KEY) is not None:
            return
        address = runtime().address
        dispatch.handle_spawn(
            protocol.spawn(
                _REGISTRY_KEY, "controllers", 0, [[], []], (address,), ["root", "root", "<root>"], None
            ),
            payload.dumps((_ControllerRegistry, (), {})),
        )


def _registry() -> ActorMesh[_ControllerRegistry]:
    address = root_address()
    if address == runtime().address:
        _start_registry()
    return ActorMesh(_ControllerRegistry, "controllers", _REGISTRY_KEY, (address,), Shape.unity())


def get_or_spawn_controller(name: str, Class: type[T], *args: Any, **kwargs: Any) -> Future[T]:
    """The process-wide singleton actor ``name``, spawned once in the client process."""
    validate_actor_class(Class, args, kwargs)
    return _registry().get_or_spawn.call_one(name, Class, args, kwargs)


_register_on_demand()
