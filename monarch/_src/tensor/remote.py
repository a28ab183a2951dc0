"""Free remote functions (``monarch.remote``) and ``endpoint.rref``.

A remote function runs on every proc of the active mesh. Called as a tensor op (``f(x)`` or
``f.rref(x)``) it is queued like any torch op and its result is a distributed tensor, shaped on
the client by ``propagate`` (or, without one, by running the function itself on meta tensors).
Called with an adverb (``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``, or
``send(f, ...)``) it runs on each proc's worker after every op issued before it, and its
return values come back like an endpoint's.

``endpoint.rref(...)`` is queued the same way: when its turn comes, each proc's worker calls
the endpoint of the actor on its own proc with the local shards of the arguments, and stores
the result as that proc's shard of the returned tensor.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from monarch._src.actor.actor_mesh import ActorMesh
from monarch._src.actor.endpoint import NotAnEndpoint, as_endpoint
from monarch._src.actor.future import Future
from monarch._src.actor.port import Port
from monarch._src.mesh.shape import Shape
from monarch._src.tensor.controller import MeshContext
from monarch._src.tensor.tensor import (
    Tensor,
    active_context,
    context_of,
    handles_in,
    on_client,
    record,
    to_meta,
    to_refs,
)
from monarch._src.tensor.worker import TensorWorker

NO_ACTIVE_MESH = (
    "Calling a 'remote' monarch function requires an active proc_mesh (`with proc_mesh.activate():`)"
)


class NamedFunction:
    """A function given as ``"module.path"``: imported where it runs, by that name."""

    def __init__(self, path: str) -> None:
        module, _, name = path.rpartition(".")
        if not module:
            raise ValueError(f"remote({path!r}): give a function as 'module.function'")
        self.path = path
        self.__qualname__ = path  # how errors name the op

    def load(self) -> Callable[..., Any]:
        module, _, name = self.path.rpartition(".")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)

    def __repr__(self) -> str:
        return self.path


def _shape_result(ctx: MeshContext, fn: Callable[..., Any], args: tuple, kwargs: dict, propagate: Any) -> Any:
    """The meta value of ``fn``'s result: ``propagate`` (or ``fn`` itself) on meta arguments."""
    shaper = propagate if propagate is not None else fn
    with on_client():
        try:
            result = shaper(*to_meta(args), **to_meta(kwargs))
        except Exception as e:
            what = (
                "its propagate function" if propagate is not None else "the function itself, on meta tensors,"
            )
            raise RuntimeError(
                f"the shape of {getattr(fn, '__name__', fn)}'s result is unknown: {what} raised {e!r}\n"
                "HINT: give propagate=, a function of the same arguments returning a tensor of the result's shape."
            ) from e
        # ``propagate=lambda x: x`` returns its argument: the result is a new tensor all the same
        return pytree.tree_map(lambda v: torch.empty_like(v) if type(v) is Tensor else v, result)


class Remote:
    """A function that runs on every proc of the active mesh (``monarch.remote(fn)``)."""

    def __init__(self, fn: Callable[..., Any] | str, propagate: Any = None) -> None:
        self.fn: Callable[..., Any] = NamedFunction(fn) if isinstance(fn, str) else fn
        self.propagate = propagate
        self.__name__ = getattr(fn, "__name__", str(fn))
        self.__doc__ = getattr(fn, "__doc__", None)

    def _context(self, args: tuple, kwargs: dict) -> MeshContext:
        active = active_context()
        if active is None:
            raise ValueError(NO_ACTIVE_MESH)
        return context_of(handles_in(args, kwargs), active)

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Run on every proc as a tensor op; returns the result as distributed tensor(s)."""
        ctx = self._context(args, kwargs)
        fn = self.fn.load() if isinstance(self.fn, NamedFunction) and self.propagate is None else self.fn
        result = _shape_result(ctx, fn, args, kwargs, self.propagate)
        return record(ctx, self.fn, args, kwargs, result, handles_in(args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.rref(*args, **kwargs)

    def _workers(self, args: tuple, kwargs: dict) -> tuple[ActorMesh[TensorWorker], tuple]:
        ctx = self._context(args, kwargs)
        ctx.controller.flush()
        return ctx.workers, (self.fn, to_refs(args), to_refs(kwargs))

    def call(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run on every proc; a ValueMesh of the return values."""
        workers, call = self._workers(args, kwargs)
        return workers.call_function.call(*call)

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run on the single proc of the active mesh; its return value."""
        workers, call = self._workers(args, kwargs)
        return workers.call_function.call_one(*call)

    def choose(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run on one proc of the active mesh, picked at random; its return value."""
        workers, call = self._workers(args, kwargs)
        return workers.call_function.choose(*call)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[Any]]:
        """Run on every proc; one Future per proc, in the order the return values arrive."""
        workers, call = self._workers(args, kwargs)
        return workers.call_function.stream(*call)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Run on every proc, with no reply."""
        workers, call = self._workers(args, kwargs)
        workers.call_function.broadcast(*call)

    def send_to_port(self, args: tuple, kwargs: dict, port: Port[Any] | None, selection: Any) -> None:
        """``monarch.actor.send(f, args, kwargs, port)``: every proc's return value goes to ``port``."""
        from monarch._src.actor.messaging import send

        workers, call = self._workers(tuple(args), dict(kwargs))
        send(workers.call_function, call, {}, port, selection)

    def __repr__(self) -> str:
        return f"<remote function {self.__name__}>"


def remote(fn: Callable[..., Any] | str | None = None, *, propagate: Any = None) -> Any:
    """Make ``fn`` (a function, or ``"module.function"``) run on the procs of the active mesh:
    ``@remote``, ``@remote(propagate=...)`` or ``remote(fn)``."""
    if fn is None:
        return lambda f: Remote(f, propagate)
    return Remote(fn, propagate)


# -- endpoint.rref ------------------------------------------------------------------------------


class EndpointCall:
    """Runs on a proc's worker: calls the endpoint of the actor on that proc, returns its result."""

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self.mesh = mesh
        self.name = name
        self.__qualname__ = f"{name}.rref"  # how errors name the op

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from monarch._src.actor.process_state import runtime

        cls, name, key, addresses, shape = self.mesh.__reduce__()[1]
        here = runtime().address
        for base in shape.ranks():
            if addresses[base] == here:
                local: ActorMesh[Any] = ActorMesh(cls, name, key, (here,), Shape.unity())
                method = getattr(local, self.name)
                if isinstance(method, NotAnEndpoint):  # as_endpoint(mesh.method, propagate=...).rref()
                    method = as_endpoint(method)
                return method.call_one(*args, **kwargs).get()
        raise RuntimeError(f"actor mesh {name} has no actor on this proc ({here}) to run {self.name}.rref")


def endpoint_rref(mesh: ActorMesh[Any], name: str, propagate: Any, args: tuple, kwargs: dict) -> Any:
    """``mesh.name.rref(*args, **kwargs)``, queued in order with the tensor ops of the mesh."""
    handles = handles_in(args, kwargs)
    active = active_context()
    if active is None and not handles:
        raise ValueError(
            f"{name}.rref() needs an active mesh (`with proc_mesh.activate():`) or a distributed tensor argument"
        )
    ctx = context_of(handles, active)
    if propagate is None:
        raise ValueError(
            f"{name}.rref() needs the shape of the endpoint's result\n"
            f"HINT: declare it with @endpoint(propagate=lambda *args: <a tensor shaped like the result>)."
        )
    call = EndpointCall(mesh, name)
    if propagate == "inspect":  # Monarch's name for an endpoint whose result is not a tensor
        ctx.controller.record(ctx, call, to_refs(args), to_refs(kwargs), [])
        if active is None:
            ctx.controller.flush()
        return None
    result = _shape_result(ctx, call, args, kwargs, propagate)
    return record(ctx, call, args, kwargs, result, handles)
