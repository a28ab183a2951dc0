"""``HostMesh``: machines to spawn processes on; ``this_host``; client shutdown."""

from __future__ import annotations

import atexit
import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from monarch._src.actor import proc_mesh as proc_mesh_module
from monarch._src.actor.future import Future, completed_future
from monarch._src.actor.proc_mesh import ProcMesh, run_bootstrap
from monarch._src.actor.process_state import retire_runtime
from monarch._src.mesh.extent import Extent
from monarch._src.mesh.mesh_trait import MeshTrait
from monarch._src.mesh.point import Point
from monarch._src.mesh.shape import Shape

if TYPE_CHECKING:  # the spawner is imported when the first processes are spawned
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
        self.group.on_exit.append(lambda rank, how, code: on_exit(rank, code))
        for rank, code in enumerate(list(self.group.returncodes)):
            if code is not None:
                on_exit(rank, code)

    def kill(self) -> None:
        self.group.kill()


class HostMesh(MeshTrait):
    """A mesh of hosts. On the client, ``this_host()`` is the local machine (0-dimensional)."""

    def __init__(self, shape: Shape, is_local: bool = True) -> None:
        self._host_shape = shape
        self._is_local = is_local
        self._shut_down = False

    @property
    def _shape(self) -> Shape:
        return self._host_shape

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._is_local)

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        env: EnvSpec = None,
        preload: Sequence[str] | None = None,
    ) -> ProcMesh:
        """Start one OS process per point of ``per_host`` on every host; returns at once.

        ``bootstrap`` runs first on every new process (e.g. to set variables before CUDA
        initializes); ``env`` adds environment variables, either one mapping for all processes
        or a function of each process's Point (how the launcher gives every rank its own).
        ``preload`` (monarch-aio) names modules to import once, in a template process that
        every process is then forked from (see ``host/forkserver.py``): four processes that
        import torch pay for one import.
        """
        if self._shut_down:
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
        from monarch._src.host.spawner import ProcGroup  # subprocess is slow to import

        group = ProcGroup(name, envs, gated=bootstrap is not None, preload=list(preload or ()))
        mesh = ProcMesh(tuple(group.addresses), Shape.from_extent(extent), owner=_ProcMeshOwner(group))
        if bootstrap is not None:
            mesh._initialized = run_bootstrap(mesh, bootstrap)
        return mesh

    def shutdown(self) -> Future[None]:
        """Mark this host mesh finished with; a second call raises, as shutting down twice is a bug."""
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        self._shut_down = True
        return completed_future(None)

    @property
    def initialized(self) -> Future[bool]:
        """Resolves once the hosts can spawn processes; already done, as they start processes on demand."""
        return completed_future(True)

    def __reduce__(self) -> Any:
        return (HostMesh, (self._host_shape, self._is_local))

    def __repr__(self) -> str:
        return f"HostMesh({self._host_shape.extent})"


def _local_host_mesh() -> HostMesh:
    return HostMesh(Shape.unity())


proc_mesh_module.local_host_mesh_factory = _local_host_mesh


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

        stop_all_groups(timeout=1.0)
        flush_at_exit()  # what the workers printed last, and buffered aggregation, before exit
        rt.shutdown()
    return completed_future(None)


atexit.register(shutdown_context)
