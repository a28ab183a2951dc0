"""``ActorMesh``: a picklable reference to the actors of one spawn, over a (sliced) shape.

A mesh holds the address of the process of every rank it was spawned on and a Shape whose
base ranks index those addresses, so a slice keeps addressing the right processes and a
mesh passed to another actor works there unchanged.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from monarch._src.actor import supervision
from monarch._src.actor.actor import endpoint_table
from monarch._src.actor.endpoint import ActorEndpoint, NotAnEndpoint
from monarch._src.actor.future import Future, completed_future
from monarch._src.mesh.mesh_trait import MeshTrait
from monarch._src.mesh.shape import Shape

T = TypeVar("T")


class ActorMesh(MeshTrait, Generic[T]):
    """What ``ProcMesh.spawn`` returns; typed as the actor class for IDE completion."""

    def __init__(self, cls: type, name: str, key: str, addresses: tuple[str, ...], shape: Shape) -> None:
        self._class = cls
        self._class_name = cls.__name__
        self._mesh_name = name
        self._key = key
        self._addresses = addresses
        self._mesh_shape = shape
        self._endpoint_cache: dict[str, Any] = {}
        self._dest_cache: list[tuple[int, str]] | None = None
        ext = shape.extent
        self._wire_extent = [ext.labels, ext.sizes]
        #: Keeps this mesh's stop/failure records (and what they need) while a handle exists.
        self._handles = supervision.mesh_handles(key)

    # -- MeshTrait ----------------------------------------------------------------------------

    @property
    def _shape(self) -> Shape:
        return self._mesh_shape

    def _new_with_shape(self, shape: Shape) -> ActorMesh[T]:
        return ActorMesh(self._class, self._mesh_name, self._key, self._addresses, shape)

    # -- messaging support --------------------------------------------------------------------

    def _destinations(self) -> list[tuple[int, str]]:
        """(message rank, process address) for every rank of this (sliced) mesh."""
        d = self._dest_cache
        if d is None:
            addrs = self._addresses
            d = self._dest_cache = [(i, addrs[base]) for i, base in enumerate(self._mesh_shape.ranks())]
        return d

    def _dest_addresses(self) -> list[str]:
        return [a for _, a in self._destinations()]

    def _extent_wire(self) -> list[Any]:
        return self._wire_extent

    def _shape_renumbered(self) -> Shape:
        return Shape.from_extent(self._mesh_shape.extent)

    def _check_usable(self, endpoint: str) -> None:
        """Raise SupervisionError if a rank of this (sliced) mesh is known failed or stopped."""
        if not supervision.any_trouble():  # the common case, on every call: nothing to look up
            return
        err = supervision.mesh_error(self._key, self._mesh_name, endpoint, self._dest_addresses())
        if err is not None:
            raise err

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_class", "_endpoint_cache", "_mesh_shape"):
            raise AttributeError(name)
        cache = self._endpoint_cache
        ep = cache.get(name)
        if ep is not None:
            return ep
        prop = endpoint_table(self._class).get(name)
        if prop is not None:
            ep = cache[name] = ActorEndpoint(self, name, prop)
            return ep
        if callable(getattr(self._class, name, None)):
            return NotAnEndpoint(self, name)
        raise AttributeError(f"actor mesh of {self._class_name} has no endpoint or attribute {name!r}")

    # -- lifecycle ----------------------------------------------------------------------------

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop these actors after they drain the messages already sent; runs ``__cleanup__``."""
        from monarch._src.actor.proc_mesh import stop_actors  # proc meshes are made of actor meshes

        supervision.mark_stopped(self._key, reason)
        return stop_actors(self._key, self._dest_addresses(), self._mesh_name)

    @property
    def initialized(self) -> Future[None]:
        """Resolves once the actors exist; already done, as messages sent before ``__init__`` ends wait in
        the mailbox."""
        return completed_future(None)

    def __reduce__(self) -> Any:
        return (ActorMesh, (self._class, self._mesh_name, self._key, self._addresses, self._mesh_shape))

    def __repr__(self) -> str:
        return (
            f"ActorMesh(class={self._class_name}, shape={self._mesh_shape.extent}, name={self._mesh_name!r})"
        )


def keep_while_referenced(mesh: ActorMesh[Any], owner: Any) -> None:
    """Keep ``owner`` (what runs the mesh's processes) alive while a handle to ``mesh`` exists:
    calls through the handle must still learn that its processes are gone."""
    mesh._handles.keep = owner
