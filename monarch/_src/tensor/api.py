"""The tensor engine's functions on the ``monarch`` package: fetching, the active mesh, moving tensors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils import _pytree as pytree

from monarch._src.actor import future
from monarch._src.actor.future import Future
from monarch._src.actor.proc_mesh import ProcMesh
from monarch._src.tensor.controller import MeshContext, controller_for
from monarch._src.tensor.tensor import Tensor, activation, active_context, on_client, record


def fetch_shard(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Future[Any]:
    """A Future of ``obj`` (a tensor or a pytree of them) with each distributed tensor replaced by
    a CPU copy of its value on the proc at the given coordinates (a dimension not given: 0)."""
    coords = {**(shard or {}), **kwargs}
    leaves, spec = pytree.tree_flatten(obj)
    wanted: dict[tuple[MeshContext, int], list[int]] = {}
    for i, leaf in enumerate(leaves):
        if type(leaf) is Tensor:
            wanted.setdefault((leaf.context, leaf.context.rank_of(coords)), []).append(i)
    # one fetch per proc asked, all sent before any is waited for
    replies: list[tuple[list[int], Future[Any]]] = [
        (positions, ctx.controller.fetch(ctx, rank, [leaves[i].ref_id for i in positions]))
        for (ctx, rank), positions in wanted.items()
    ]
    done: Future[Any] = future.pending_future()

    def settle(all_done: Future[None]) -> None:
        for positions, reply in replies:
            got, exc = future.outcome(reply)
            values = got or []
            if exc is None:  # the worker answers (True, value) or (False, RemoteException) for each
                exc = next((value for ok, value in values if not ok), None)
            if exc is not None:
                future.set_exception(done, exc)
                return
            for at, (_, value) in zip(positions, values):
                leaves[at] = value
        future.set_result(done, pytree.tree_unflatten(leaves, spec))

    future.add_done_callback(future.when_all_done([reply for _, reply in replies]), settle)
    return done


def inspect(obj: Any, shard: dict[str, int] | None = None, **kwargs: int) -> Any:
    """``fetch_shard(...).result()``: the values, waited for."""
    return fetch_shard(obj, shard, **kwargs).result()


def get_active_mesh() -> ProcMesh | None:
    """The mesh of the innermost ``activate()`` block in this thread, or None."""
    ctx = active_context()
    return ctx.mesh if ctx is not None else None


class NoMesh:
    """``monarch.no_mesh``: ``with no_mesh.activate():`` runs torch as usual inside an active mesh."""

    @contextmanager
    def activate(self) -> Iterator[None]:
        """A block in which no mesh is active: torch ops compute locally."""
        with activation(None):
            yield


no_mesh = NoMesh()


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A proc's value, under the id of a new handle (on another view of the same procs)."""
    return t


def slice_mesh(tensors: Any, **dims: int | slice) -> Any:
    """``tensors`` (a tensor or a pytree) as tensors on the slice ``mesh.slice(**dims)`` of their mesh:
    the same local values, on the procs of the slice."""
    leaves, spec = pytree.tree_flatten(tensors)
    for i, leaf in enumerate(leaves):
        if type(leaf) is Tensor:
            ctx = leaf.context
            target = ctx.controller.context(ctx.mesh.slice(**dims))
            leaves[i] = _move(leaf, target)
    return pytree.tree_unflatten(leaves, spec)


def _move(t: Tensor, target: MeshContext) -> Tensor:
    source = t.context
    missing = set(target.addresses) - set(source.addresses)
    if missing or source.controller is not target.controller:
        raise NotImplementedError(
            f"moving a tensor from mesh {source!r} to mesh {target!r}, whose procs do not all hold it, "
            "is not supported\nHINT: compute it on the target mesh, or fetch it and create it there."
        )
    with on_client():
        meta = torch.empty_like(t, device="meta")
    return record(target, _alias, (t,), {}, meta, [t])


def to_mesh(tensors: Any, mesh: ProcMesh, stream: Any = None) -> Any:
    """``tensors`` (a tensor or a pytree) as tensors on ``mesh``, which must be the same procs or a
    subset of them (a slice of the tensors' mesh)."""
    leaves, spec = pytree.tree_flatten(tensors)
    for i, leaf in enumerate(leaves):
        if type(leaf) is Tensor:
            leaves[i] = _move(leaf, controller_for(mesh).context(mesh))
    return pytree.tree_unflatten(leaves, spec)


def reduce(
    tensors: Any,
    dims: str | list[str],
    reduction: str = "sum",
    scatter: bool = False,
    mesh: ProcMesh | None = None,
    _inplace: bool = False,
) -> Any:
    """``t.reduce(...)`` for each distributed tensor of a pytree."""
    return pytree.tree_map(
        lambda t: t.reduce(dims, reduction, scatter, mesh, _inplace=_inplace) if type(t) is Tensor else t,
        tensors,
    )


def reduce_(tensors: Any, dims: str | list[str], reduction: str = "sum", **options: Any) -> Any:
    """``reduce`` in place: each distributed tensor of the pytree holds its result."""
    return reduce(tensors, dims, reduction, _inplace=True, **options)
