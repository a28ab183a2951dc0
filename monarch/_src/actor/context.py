"""``context()``: which actor is running this code, and where the current message was sent."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

from monarch._src.mesh.extent import Extent
from monarch._src.mesh.point import Point

if TYPE_CHECKING:
    from monarch._src.actor.instance import ActorInstance

current_instance: contextvars.ContextVar[ActorInstance | None] = contextvars.ContextVar(
    "monarch_actor_instance", default=None
)
current_message_rank: contextvars.ContextVar[Point | None] = contextvars.ContextVar(
    "monarch_message_rank", default=None
)

EMPTY_EXTENT = Extent([], [])
SINGLETON_POINT = Point(0, EMPTY_EXTENT)

_extents: dict[tuple, Extent] = {}


def extent_of(labels: list[str], sizes: list[int]) -> Extent:
    """Interned Extent for a message's wire form (messages repeat the same few extents)."""
    key = (tuple(labels), tuple(sizes))
    ext = _extents.get(key)
    if ext is None:
        if len(_extents) > 4096:
            _extents.clear()
        ext = _extents[key] = Extent(labels, sizes)
    return ext


_points: dict[tuple, Point] = {}


def point_of(rank: int, labels: list[str], sizes: list[int]) -> Point:
    """Interned Point for a message's wire form."""
    key = (rank, tuple(labels), tuple(sizes))
    p = _points.get(key)
    if p is None:
        if len(_points) > 16384:
            _points.clear()
        p = _points[key] = Point(rank, extent_of(labels, sizes))
    return p


class Context:
    """What ``context()`` returns."""

    __slots__ = ("_instance", "_message_rank")

    def __init__(self, instance: ActorInstance, message_rank: Point) -> None:
        self._instance = instance
        self._message_rank = message_rank

    @property
    def actor_instance(self) -> ActorInstance:
        """The instance running this code (the client's root instance outside any actor)."""
        return self._instance

    @property
    def message_rank(self) -> Point:
        """This actor's position among the actors the current message was sent to; it differs from
        ``actor_instance.rank`` when the sender called a slice of the mesh."""
        return self._message_rank


def context() -> Context:
    """The running actor's context; outside any actor, the client's root context."""
    inst = current_instance.get()
    if inst is None:
        from monarch._src.actor.instance import root_instance  # an instance sits far above contexts

        inst = root_instance()
    rank = current_message_rank.get()
    return Context(inst, rank if rank is not None else inst.rank)


def current_rank() -> Point:
    """The rank of the running actor for the current message; Monarch's shorthand for
    ``context().message_rank``."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """``{label: size}`` of the mesh the current message was sent to."""
    return dict(context().message_rank.extent)


def current_actor_name() -> str:
    """The running actor's ``actor_id``, e.g. to tag logs or files per actor."""
    return str(context().actor_instance.actor_id)
