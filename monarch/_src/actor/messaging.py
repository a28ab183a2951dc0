"""Low-level ``send`` and ``Accumulator``, built on the same ports as the adverbs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from monarch._src.actor.collectors import fold_stream
from monarch._src.actor.endpoint import ActorEndpoint, Selection
from monarch._src.actor.future import Future
from monarch._src.actor.port import Port

A = TypeVar("A")
R = TypeVar("R")


def send(
    endpoint: Any,
    args: tuple,
    kwargs: dict,
    port: Port[Any] | None = None,
    selection: Selection = "all",
) -> None:
    """Send ``endpoint(*args, **kwargs)`` to the mesh; each reply goes to ``port`` (if any)."""
    # Besides a mesh's endpoints, anything that sends itself the same way: the tensor layer's
    # free remote functions (``monarch.remote``).
    if not isinstance(endpoint, ActorEndpoint) and not callable(getattr(endpoint, "send_to_port", None)):
        raise TypeError(f"send() needs an endpoint of a spawned mesh (mesh.method), got {endpoint!r}")
    if selection not in ("all", "choose"):
        raise ValueError(f"selection must be 'all' or 'choose', got {selection!r}")
    endpoint.send_to_port(tuple(args), dict(kwargs), port, selection)


class Accumulator(Generic[R, A]):
    """Folds the replies of ``endpoint.stream(...)`` with ``combine``, starting at ``identity``."""

    def __init__(self, endpoint: ActorEndpoint[R], identity: A, combine: Callable[[A, R], A]) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Call the endpoint on every actor and fold the replies, in arrival order, into one value."""
        return fold_stream(list(self._endpoint.stream(*args, **kwargs)), self._identity, self._combine)
