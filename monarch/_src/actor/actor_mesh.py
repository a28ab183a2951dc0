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


class MeshRef:
    """The wiring of an actor mesh reference, for the endpoints that send to it (internal).

    ``ActorMesh`` is public, and any attribute name on it would hide an endpoint of that name,
    so what an endpoint reads on every send lives here, under plain names.
    """

    __slots__ = (
        "cls",
        "class_name",
        "name",
        "key",
        "addresses",
        "shape",
        "wire_extent",
        "_destinations",
        "_renumbered",
        "_dest_addresses",
    )

    def __init__(self, cls: type, name: str, key: str, addresses: tuple[str, ...], shape: Shape) -> None:
        self.cls = cls
        self.class_name = cls.__name__
        self.name = name
        self.key = key
        #: The process of every rank of the spawn; ``shape``'s base ranks index it.
        self.addresses = addresses
        self.shape = shape
        ext = shape.extent
        #: The extent as a message header carries it.
        self.wire_extent: list[Any] = [ext.labels, ext.sizes]
        self._destinations: list[tuple[int, str]] | None = None
        self._renumbered: Shape | None = None
        self._dest_addresses: list[str] | None = None

    def destinations(self) -> list[tuple[int, str]]:
        """(message rank, process address) for every rank of this (sliced) mesh."""
        d = self._destinations
        if d is None:
            addrs = self.addresses
            d = self._destinations = [(i, addrs[base]) for i, base in enumerate(self.shape.ranks())]
        return d

    def dest_addresses(self) -> list[str]:
        """The process address of every rank of this (sliced) mesh, in ``destinations()``'s
        order; one list, made once, which callers must not change."""
        a = self._dest_addresses
        if a is None:
            a = self._dest_addresses = [address for _, address in self.destinations()]
        return a

    def shape_renumbered(self) -> Shape:
        """This (sliced) mesh's shape with ranks 0..n-1, the shape of a gathered reply."""
        shape = self._renumbered
        if shape is None:
            shape = self._renumbered = Shape.from_extent(self.shape.extent)
        return shape

    def check_usable(self, endpoint: str) -> None:
        """Raise SupervisionError if a rank of this (sliced) mesh is known failed or stopped."""
        if not supervision.any_trouble():  # the common case, on every call: nothing to look up
            return
        err = supervision.mesh_error(self.key, self.name, endpoint, self.dest_addresses())
        if err is not None:
            raise err


class ActorMesh(MeshTrait, Generic[T]):
    """What ``ProcMesh.spawn`` returns; typed as the actor class for IDE completion."""

    def __init__(self, cls: type, name: str, key: str, addresses: tuple[str, ...], shape: Shape) -> None:
        self._ref = MeshRef(cls, name, key, addresses, shape)
        #: Keeps this mesh's stop/failure records (and what they need) while a handle exists.
        self._handles = supervision.mesh_handles(key)

    # -- MeshTrait ----------------------------------------------------------------------------

    @property
    def _shape(self) -> Shape:
        return self._ref.shape

    def _new_with_shape(self, shape: Shape) -> ActorMesh[T]:
        ref = self._ref
        return ActorMesh(ref.cls, ref.name, ref.key, ref.addresses, shape)

    # -- endpoints ----------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_ref", "_handles"):
            raise AttributeError(name)
        ref = self._ref
        prop = endpoint_table(ref.cls).get(name)
        if prop is not None:
            # Kept as an instance attribute: later lookups find it without calling this method.
            ep = self.__dict__[name] = ActorEndpoint(self, ref, name, prop)
            return ep
        if callable(getattr(ref.cls, name, None)):
            return NotAnEndpoint(self, ref, name)
        raise AttributeError(f"actor mesh of {ref.class_name} has no endpoint or attribute {name!r}")

    # -- lifecycle ----------------------------------------------------------------------------

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop these actors after they drain the messages already sent; runs ``__cleanup__``.
        Fails ``MONARCH_ACTOR_STOP_TIMEOUT_S`` after the stop naming the ranks still running
        something, and 2 s later those whose process did not answer at all (frozen)."""
        from monarch._src.actor.proc_mesh import stop_actors  # proc meshes are made of actor meshes

        ref = self._ref
        supervision.mark_stopped(ref.key, reason)
        return stop_actors(ref.key, ref.dest_addresses(), ref.name)

    @property
    def initialized(self) -> Future[None]:
        """Resolves once the actors exist; already done, as messages sent before ``__init__`` ends wait in
        the mailbox."""
        return completed_future(None)

    def __reduce__(self) -> Any:
        ref = self._ref
        return (ActorMesh, (ref.cls, ref.name, ref.key, ref.addresses, ref.shape))

    def __repr__(self) -> str:
        ref = self._ref
        return f"ActorMesh(class={ref.class_name}, shape={ref.shape.extent}, name={ref.name!r})"


def keep_while_referenced(mesh: ActorMesh[Any], owner: Any) -> None:
    """Keep ``owner`` (what runs the mesh's processes) alive while a handle to ``mesh`` exists:
    calls through the handle must still learn that its processes are gone."""
    mesh._handles.keep = owner
