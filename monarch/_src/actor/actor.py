"""``Actor``: the base class users subclass, and the checks made when spawning one."""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from monarch._src.actor.coroutines import is_coroutine_function
from monarch._src.actor.endpoint import EndpointProperty

#: Attributes of ActorMesh that an endpoint name must not shadow.
MESH_ATTRIBUTES = frozenset(
    {"stop", "slice", "size", "sizes", "extent", "flatten", "split", "rename", "initialized", "spawn"}
)


class Actor:
    """Base class of actors: subclass it and mark remotely callable methods with ``@endpoint``."""

    @cached_property
    def logger(self) -> logging.Logger:
        lg = logging.getLogger(type(self).__name__)
        lg.setLevel(logging.DEBUG)
        return lg


def endpoint_table(cls: type) -> dict[str, EndpointProperty[Any]]:
    """The endpoints of ``cls`` (including inherited ones), computed once per class."""
    table = cls.__dict__.get("__monarch_endpoints__")
    if table is None:
        table = {}
        for klass in reversed(cls.__mro__):
            for name, attr in vars(klass).items():
                if isinstance(attr, EndpointProperty):
                    table[name] = attr
                elif name in table:
                    del table[name]
        cls.__monarch_endpoints__ = table  # type: ignore[attr-defined]
    return table


def is_async_actor(cls: type) -> bool:
    """Whether the actor runs on the event loop (async endpoints) or on its own thread."""
    table = endpoint_table(cls)
    if table:
        return any(p.is_async for p in table.values())
    return any(is_coroutine_function(getattr(cls, hook, None)) for hook in ("__supervise__", "__cleanup__"))


def validate_actor_class(cls: Any, args: tuple, kwargs: dict) -> None:
    """Raise at the spawn call site for anything that would only fail later, remotely."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise ValueError(f"{cls} must subclass monarch.service.Actor to spawn it.")
    table = endpoint_table(cls)
    sync = sorted(n for n, p in table.items() if not p.is_async)
    asyn = sorted(n for n, p in table.items() if p.is_async)
    if sync and asyn:
        raise ValueError(
            f"{cls} mixes both async and sync endpoints.Synchronous endpoints cannot be mixed with "
            f"async endpoints because they can cause the asyncio loop to deadlock if they wait."
            f"sync: {sync} async: {asyn}"
        )
    cleanup = getattr(cls, "__cleanup__", None)
    if cleanup is not None:
        if sync and is_coroutine_function(cleanup):
            raise ValueError(f"{cls} has sync endpoints but an async __cleanup__; make them match.")
        if asyn and not is_coroutine_function(cleanup):
            raise ValueError(f"{cls} has async endpoints but a sync __cleanup__; make them match.")
    clash = sorted(MESH_ATTRIBUTES & table.keys())
    if clash:
        raise ValueError(f"ActorMesh has an attribute that collides with an endpoint name: {clash}")
    init = cls.__init__
    if init is not object.__init__:
        try:
            import inspect

            inspect.signature(init).bind(None, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"wrong arguments to spawn {cls.__name__}: {e}") from None
    elif args or kwargs:
        raise TypeError(f"{cls.__name__}() takes no arguments, but spawn was given some")
