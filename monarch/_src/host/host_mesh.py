"""``HostMesh``: machines to spawn processes on; ``this_host``; client shutdown."""

from __future__ import annotations

import atexit
import itertools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from monarch._src.actor import proc_mesh as proc_mesh_module
from monarch._src.actor.future import (
    Future,
    add_done_callback,
    completed_future,
    pending_future,
    set_result,
    when_all_done,
    when_all_succeeded,
)
from monarch._src.actor.proc_mesh import ProcMesh, ProcOwner, run_bootstrap
from monarch._src.actor.process_state import retire_runtime
from monarch._src.mesh.extent import Extent
from monarch._src.mesh.mesh_trait import MeshTrait
from monarch._src.mesh.point import Point
from monarch._src.mesh.shape import Shape

if TYPE_CHECKING:  # imported when the first processes are spawned, or hosts attached
    from monarch._src.host.remote import Host, HostConnection
    from monarch._src.host.spawner import ProcGroup

EnvSpec = Mapping[str, str] | Callable[[Point], Mapping[str, str]] | None

_names = itertools.count()


class _ProcMeshOwner:
    """Adapts a ProcGroup to what ProcMesh needs from its owner."""

    def __init__(self, group: ProcGroup) -> None:
        self.group = group

    @property
    def stopped(self) -> bool:
        return self.group.stopped

    def stop(self, reason: str) -> Future[None]:
        return self.group.stop(reason)

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.group.procs]

    def watch_exits(self, on_exit: Callable[[int, int], None]) -> None:
        self.group.watch_exits(lambda rank, how, code: on_exit(rank, code))

    def kill(self) -> None:
        self.group.kill()


class HostMesh(MeshTrait):
    """A mesh of hosts. On the client, ``this_host()`` is the local machine (0-dimensional);
    ``hosts_from_config`` and ``attach_to_workers`` give meshes of machines run by host agents.
    """

    def __init__(
        self, shape: Shape, hosts: tuple[Host, ...] | None = None, owner: _Attachment | None = None
    ) -> None:
        self._host_shape = shape
        #: By base rank, the machines reached through host agents; None: this machine, where
        #: this process spawns the procs itself.
        self._hosts = hosts
        #: The attachment this mesh made (only the mesh ``attach`` returned: it may shut down).
        self._owner = owner
        self._shut_down = False
        #: The name given to ``attach_to_workers`` (for people).
        self._name: str | None = None

    @property
    def _shape(self) -> Shape:
        return self._host_shape

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._hosts)

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        env: EnvSpec = None,
        preload: Sequence[str] | None = None,
    ) -> ProcMesh:
        """Start one OS process per point of ``per_host`` on every host; returns at once
        (on hosts run by agents, after one round trip to each host's agent).

        ``bootstrap`` runs first on every new process (e.g. to set variables before CUDA
        initializes); ``env`` adds environment variables, either one mapping for all processes
        or a function of each process's Point (how the launcher gives every rank its own).
        ``preload`` (monarch-aio) names modules to import once, in a template process that
        every process is then forked from (see ``host/forkserver.py``): four processes that
        import torch pay for one import.
        """
        if self._shut_down or (self._owner is not None and self._owner.shut_down):
            raise RuntimeError("HostMesh has already been shut down")
        if isinstance(preload, str):
            raise TypeError(
                f"preload takes a list of module names, got the string {preload!r}\n"
                f"HINT: preload=[{preload!r}]"
            )
        per_host = dict(per_host or {})
        host_ext = self._host_shape.extent
        overlap = set(per_host) & set(host_ext.labels)
        if overlap:
            raise ValueError(f"per_host labels {sorted(overlap)} overlap with host labels {host_ext.labels}")
        for label, size in per_host.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"per_host[{label!r}] must be a positive int, got {size!r}")
        extent = Extent([*host_ext.labels, *per_host], [*host_ext.sizes, *per_host.values()])
        name = name or f"anon{next(_names)}"
        envs = []
        for rank in range(extent.nelements):
            if callable(env):
                envs.append(dict(env(Point(rank, extent))))
            else:
                envs.append(dict(env or {}))
        owner: ProcOwner
        if self._hosts is not None:
            from monarch._src.host.remote import RemoteProcGroup

            per = len(envs) // host_ext.nelements
            hosts = [self._hosts[r] for r in self._host_shape.ranks()]
            envs_by_host = [envs[i * per : (i + 1) * per] for i in range(len(hosts))]
            owner = group = RemoteProcGroup(
                name, hosts, envs_by_host, bootstrap is not None, list(preload or ())
            )
            addresses = group.addresses
            procs_hosts: tuple[Host, ...] | None = tuple(host for host in hosts for _ in range(per))
        else:
            from monarch._src.host.spawner import ProcGroup  # subprocess is slow to import

            local = ProcGroup(name, envs, gated=bootstrap is not None, preload=list(preload or ()))
            owner, addresses = _ProcMeshOwner(local), local.addresses
            procs_hosts = None
        mesh = ProcMesh(tuple(addresses), Shape.from_extent(extent), owner=owner, hosts=procs_hosts)
        if bootstrap is not None:
            mesh._initialized = run_bootstrap(mesh, bootstrap)
        return mesh

    def shutdown(self) -> Future[None]:
        """Stop every proc spawned on these hosts and end this client's sessions there.

        Only the mesh that attached may (not a slice of it, nor a copy sent to an actor); a
        second call raises, as shutting down twice is a bug."""
        if self._hosts is not None and self._owner is None:
            raise RuntimeError("cannot shut down `HostMesh` that is a reference instead of owned")
        if self._shut_down or (self._owner is not None and self._owner.shut_down):
            raise RuntimeError("HostMesh has already been shut down")
        self._shut_down = True
        if self._owner is None:
            return completed_future(None)
        return self._owner.shutdown()

    @property
    def agent_addresses(self) -> list[str]:
        """The host agents' addresses, by host rank (empty for this machine): what messages
        about a host name it by (e.g. the launcher's failure summary)."""
        if self._hosts is None:
            return []
        return [str(self._hosts[r].agent) for r in self._host_shape.ranks()]

    @property
    def initialized(self) -> Future[bool]:
        """Resolves once every host can spawn processes; fails, naming the host agent's address,
        if one cannot be attached to (unreachable, a wrong secret, no session started)."""
        if self._hosts is None:
            return completed_future(True)
        return _all_attached([self._hosts[r] for r in self._host_shape.ranks()])

    async def __aenter__(self) -> HostMesh:
        """Wait (without blocking the caller's loop) until every host is attached, so that
        ``spawn_procs`` inside does not wait for it; a host that cannot be attached raises
        here, after the others were shut down."""
        if self._hosts is not None:
            try:
                await self.initialized
            except BaseException:
                if self._owner is not None and not self._shut_down:
                    await self.shutdown()
                raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    def __reduce__(self) -> Any:
        return (HostMesh, (self._host_shape, self._hosts))

    def __repr__(self) -> str:
        if self._hosts is None:
            return f"HostMesh({self._host_shape.extent})"
        agents = [self._hosts[r].agent for r in self._host_shape.ranks()]
        name = f"{self._name!r}, " if self._name else ""
        return f"HostMesh({name}{self._host_shape.extent}, hosts={agents})"


def _all_attached(hosts: list[Host]) -> Future[bool]:
    return when_all_succeeded([host.session for host in hosts], True)


class _Attachment:
    """The connections a client opened to host agents: what an owned ``HostMesh`` shuts down."""

    def __init__(self, connections: list[HostConnection], on_shutdown: Callable[[], None] | None) -> None:
        self.connections = connections
        #: Run once every connection closed (e.g. reap the agents ``hosts_from_config`` started).
        self.on_shutdown = on_shutdown
        self.shut_down = False
        with _attachments_lock:
            _attachments.add(self)

    def shutdown(self) -> Future[None]:
        from monarch._src.host.remote import groups_on

        self.shut_down = True
        with _attachments_lock:
            _attachments.discard(self)
        attached = [c for c in self.connections if c.host.attached]
        sessions = [c.host.session_address() for c in attached]
        stopped = when_all_done([g.stop("host mesh shut down") for g in groups_on(sessions)])
        done: Future[None] = pending_future()

        def finish(_: Future[None]) -> None:
            for c in self.connections:
                c.close()
            if self.on_shutdown is None:
                set_result(done, None)
                return

            def run_on_shutdown() -> None:  # off the loop: the connections close on it
                try:
                    self.on_shutdown()  # type: ignore[misc]
                finally:
                    set_result(done, None)

            threading.Thread(target=run_on_shutdown, name="monarch-host-shutdown", daemon=True).start()

        add_done_callback(stopped, finish)
        return done


_attachments_lock = threading.Lock()
#: Attachments not shut down yet: the client's exit shuts them down.
_attachments: set[_Attachment] = set()


def attach(
    agents: Sequence[str],
    secret: bytes,
    name: str | None = None,
    on_shutdown: Callable[[], None] | None = None,
) -> HostMesh:
    """A ``{"hosts": N}`` mesh of the machines whose host agents listen at ``agents``,
    returned at once (see ``remote.attach``); ``on_shutdown`` runs after it was shut down."""
    from monarch._src.host.remote import attach as connect

    connections = connect(agents, secret)
    shape = Shape.from_extent(Extent(["hosts"], [len(agents)]))
    mesh = HostMesh(shape, tuple(c.host for c in connections), _Attachment(connections, on_shutdown))
    mesh._name = name
    return mesh


def _shutdown_attachments(timeout: float) -> None:
    with _attachments_lock:
        attachments = list(_attachments)
    futures = [a.shutdown() for a in attachments]
    for f in futures:
        try:
            f.get(timeout)
        except Exception:
            pass


def _local_host_mesh() -> HostMesh:
    """The machine this process runs on: for a proc a host agent spawned, that agent's host."""
    from monarch._src.host.session import SESSION_ENV  # sockets, actors: not on `import monarch.actor`

    session = os.environ.get(SESSION_ENV)
    if session:
        from monarch._src.host.remote import host_reference

        return HostMesh(Shape.unity(), (host_reference(session, session),))
    return HostMesh(Shape.unity())


def _host_mesh_of(host: Host | None) -> HostMesh:
    """A proc's machine as a one-host mesh (None: this machine)."""
    return _local_host_mesh() if host is None else HostMesh(Shape.unity(), (host,))


proc_mesh_module.host_mesh_factory = _host_mesh_of


def this_host() -> HostMesh:
    """The host the caller runs on (on the client: the local machine, a 0-dim mesh)."""
    return _local_host_mesh()


_shutdown_lock = threading.Lock()
_shutdown_done = False


def shutdown_context() -> Future[None]:
    """Stop every process this client spawned and close its runtime. Idempotent."""
    global _shutdown_done
    with _shutdown_lock:
        if _shutdown_done:
            return completed_future(None)
        _shutdown_done = True
    rt = retire_runtime()
    if rt is not None and not rt.closed:
        from monarch._src.host.log_capture import flush_at_exit
        from monarch._src.host.spawner import stop_all_groups

        _shutdown_attachments(timeout=1.0)
        stop_all_groups(timeout=1.0)
        flush_at_exit()  # what the workers printed last, and buffered aggregation, before exit
        rt.shutdown()
    return completed_future(None)


atexit.register(shutdown_context)
