"""The client's half of the tensor engine: ids, batches of commands, frees, fetches.

One ``Controller`` serves every mesh sliced from one root proc mesh: a ``TensorWorker`` per
proc (spawned on the first ``activate``) holds the values, and the controller hands out the
ids they are stored under. Ops are not sent one by one: they queue in a batch that goes out
as one message per proc when it grows, when a value is needed here (a fetch), when an
endpoint call or remote function must see them, or when ``activate`` ends. The procs run
batches in the order they were sent (one sender, one receiver actor), so issue order holds.

Handles freed on the client queue their ids; the next batch to their procs deletes them, so a
loop of 100k ops keeps a bounded number of remote values.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable
from typing import Any

from monarch._src.actor.actor_mesh import ActorMesh
from monarch._src.actor.future import Future
from monarch._src.actor.proc_mesh import ProcMesh, proc_mesh_reference
from monarch._src.mesh.extent import Extent
from monarch._src.mesh.shape import Shape
from monarch._src.tensor.worker import TensorWorker

#: Commands queued before a batch goes out on its own.
BATCH_LIMIT = 256


def _actor_key(mesh: ActorMesh[Any]) -> str:
    """The key the actors of a spawn share on every proc (it is what the mesh pickles to)."""
    return mesh.__reduce__()[1][2]


class MeshContext:
    """One (sliced) mesh as the engine sees it: its procs and their workers, its pending frees."""

    def __init__(self, controller: Controller, mesh: ProcMesh) -> None:
        self.controller = controller
        self.mesh = mesh
        self.addresses = tuple(mesh.proc_addresses())
        self.extent = mesh.extent
        #: Each proc's index in the root mesh (its rank in the engine's process group).
        self.root_ranks = [controller.root_addresses.index(a) for a in self.addresses]
        self.workers: ActorMesh[TensorWorker] = ActorMesh(
            TensorWorker,
            "tensor_worker",
            controller.worker_key,
            self.addresses,
            Shape.from_extent(self.extent),  # replies (remote functions' call()) by mesh coordinates
        )
        #: Ids of freed handles; appended to by finalizers (any thread, so no lock: list.append
        #: is atomic), swapped out by the next flush.
        self.freed: list[int] = []

    def rank_of(self, coords: dict[str, int]) -> int:
        """The rank, in this mesh, of the proc at ``coords`` (missing dimensions: 0)."""
        labels, sizes = self.extent.labels, self.extent.sizes
        unknown = sorted(set(coords) - set(labels))
        if unknown:
            raise ValueError(
                f"the tensor's mesh has no dimension {', '.join(map(repr, unknown))}; its dimensions are "
                f"{dict(zip(labels, sizes))}"
            )
        rank = 0
        for label, size in zip(labels, sizes):
            i = coords.get(label, 0)
            if not isinstance(i, int) or not 0 <= i < size:
                raise IndexError(f"coordinate {label}={i!r} is outside the mesh's range 0..{size - 1}")
            rank = rank * size + i
        return rank

    def coordinates(self, rank: int) -> dict[str, int]:
        coords: dict[str, int] = {}
        for label, size in reversed(list(zip(self.extent.labels, self.extent.sizes))):
            coords[label] = rank % size
            rank //= size
        return dict(reversed(list(coords.items())))

    def __repr__(self) -> str:
        return f"{dict(self.extent)}"


class Controller:
    """The tensor engine for the procs of one root mesh (and every slice of it)."""

    def __init__(self, root: ProcMesh) -> None:
        self.key = uuid.uuid4().hex
        self.root_addresses = root.root_addresses
        everyone = proc_mesh_reference(self.root_addresses, Extent(["rank"], [len(self.root_addresses)]))
        workers: Any = everyone.spawn("tensor_worker", TensorWorker, self.key, self.root_addresses)
        self.worker_key = _actor_key(workers)
        self.lock = threading.RLock()
        self.ids = itertools.count(1)
        #: By procs and shape: meshes of the same procs in other shapes (``flatten``, ``rename``)
        #: are meshes of their own, each with its tensors and frees.
        self.contexts: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]], MeshContext] = {}
        self.pending: list[tuple] = []
        self.pending_ctx: MeshContext | None = None
        #: Batches sent to each proc, by root rank: a tensor sent to an actor carries these
        #: counts, and the actor waits until its proc's worker ran that many (issue order).
        self.batches_sent = [0] * len(self.root_addresses)
        self.root_ctx = self.context(everyone)
        #: The rendezvous store of the procs' torch.distributed process group, made at the first
        #: reduction (None: not yet).
        self.world_store: Any = None

    def context(self, mesh: ProcMesh) -> MeshContext:
        extent = mesh.extent
        key = (tuple(mesh.proc_addresses()), tuple(extent.labels), tuple(extent.sizes))
        with self.lock:
            ctx = self.contexts.get(key)
            if ctx is None:
                ctx = self.contexts[key] = MeshContext(self, mesh)
            return ctx

    def record(
        self, ctx: MeshContext, fn: Callable[..., Any], args: tuple, kwargs: dict, result_ids: list[int]
    ) -> None:
        """Queue ``fn(*args, **kwargs)`` to run on every proc of ``ctx``, its tensor results stored
        under ``result_ids``."""
        self.record_command(ctx, (fn, args, kwargs, result_ids))

    def record_command(self, ctx: MeshContext, command: tuple) -> None:
        """Queue a command of ``TensorWorker.run`` for every proc of ``ctx``."""
        with self.lock:
            if self.pending_ctx is not ctx:
                if self.pending_ctx is not None:
                    self.flush()
                self.pending_ctx = ctx
            self.pending.append(command)
            if len(self.pending) >= BATCH_LIMIT or len(ctx.freed) >= BATCH_LIMIT:
                self.flush()

    def flush(self) -> None:
        """Send the pending batch, and every queued free, to their procs."""
        with self.lock:
            ctx, commands = self.pending_ctx, self.pending
            self.pending = []
            self.pending_ctx = None
            if ctx is not None:
                commands.extend(self.take_frees(ctx))
                self.send(ctx, commands)
            for other in self.contexts.values():
                if other.freed:
                    frees = self.take_frees(other)
                    if frees:
                        self.send(other, frees)

    def send(self, ctx: MeshContext, commands: list[tuple]) -> None:
        sent = self.batches_sent
        for r in ctx.root_ranks:
            sent[r] += 1
        ctx.workers.run.broadcast(commands)

    @staticmethod
    def take_frees(ctx: MeshContext) -> list[tuple]:
        freed = ctx.freed
        n = len(freed)
        if not n:
            return []
        ids = freed[:n]
        del freed[:n]
        return [(None, ids)]

    def fetch(self, ctx: MeshContext, rank: int, ids: list[int]) -> Future[list[tuple[bool, Any]]]:
        """The values of ``ids`` on one proc of ``ctx``, after every op issued so far, each as
        ``(True, tensor)`` or ``(False, RemoteException)``."""
        self.flush()
        return ctx.workers.slice(**ctx.coordinates(rank)).fetch.call_one(ids)


_controllers: dict[tuple[str, ...], Controller] = {}
_controllers_lock = threading.Lock()


def controller_for(mesh: ProcMesh) -> Controller:
    """The engine of ``mesh``'s root mesh, started (workers spawned) on first use."""
    root = mesh.root_addresses
    with _controllers_lock:
        controller = _controllers.get(root)
        if controller is None:
            controller = _controllers[root] = Controller(mesh)
        return controller
