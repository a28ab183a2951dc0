"""``monarch.Tensor``: the client's handle to a tensor that lives on every proc of a mesh.

A handle is a ``torch.Tensor`` subclass over a meta tensor: shape, dtype and strides are known
at once on the client, without asking the procs, because every op is first run here on meta
tensors. Torch calls reach ``dispatch`` through ``__torch_function__`` (the handle's, and an
active mesh's ``TorchFunctionMode``, which also catches factory functions such as
``torch.rand`` that take no tensor), which runs the op on meta tensors for the result's shape,
then queues it for the procs (``Controller.record``) and returns handles for its tensor results.

Calls that only read metadata (``t.shape``, ``t.dim()``) answer locally; calls that need the
values (``t.item()``, ``bool(t)``) are refused with a pointer to ``monarch.fetch_shard``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from monarch._src.actor.endpoint import pickling_for
from monarch._src.actor.proc_mesh import ProcMesh
from monarch._src.tensor.controller import Controller, MeshContext, controller_for
from monarch._src.tensor.worker import PIN, Ref, local_shard

#: Calls that need a tensor's values, which live on the procs.
_NEEDS_VALUES = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.__complex__,
    torch.Tensor.__array__,
}

#: Factories that take their data from the client (a client tensor too): under ``activate()``
#: they make a distributed tensor of it, where other calls on client tensors stay local.
_DATA_FACTORIES = {torch.tensor, torch.as_tensor}

#: Calls that move a tensor between devices: on the procs they do; the client's meta stand-in
#: stays on meta (and is a new tensor, as the procs' result may be).
_DEVICE_MOVES = {torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.to}

#: Calls without a tensor result that must still run on the procs.
_REMOTE_EFFECTS = {torch.manual_seed, torch.random.manual_seed}


class Tensor(torch.Tensor):
    """A distributed tensor: one local tensor on each proc of ``mesh``, all of this shape and dtype.

    Made by torch ops under ``with proc_mesh.activate():``; read one proc's value with
    ``monarch.fetch_shard`` or ``monarch.inspect``.
    """

    ref_id: int
    context: MeshContext

    @staticmethod
    def wrap(meta: torch.Tensor, context: MeshContext, ref_id: int) -> Tensor:
        """The handle of remote value ``ref_id``, shaped like ``meta``; freeing it frees the value."""
        handle = torch.Tensor._make_subclass(Tensor, meta, False)
        handle.ref_id = ref_id
        handle.context = context
        weakref.finalize(handle, context.freed.append, ref_id)
        return handle

    @property
    def mesh(self) -> ProcMesh:
        """The proc mesh each of whose procs holds a local tensor of this one."""
        return self.context.mesh

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return dispatch(func, args, kwargs or {}, active_context())

    def reduce(
        self,
        dims: str | list[str] | tuple[str, ...],
        reduction: str = "sum",
        scatter: bool = False,
        mesh: ProcMesh | None = None,
        _inplace: bool = False,
        out: Tensor | None = None,
    ) -> Tensor:
        """Combine the local tensors across the mesh dimension(s) ``dims`` (Monarch's reductions:
        stack, sum, avg, product, min, max, band, bor, bxor; ``scatter``: each proc keeps its
        slice of the result along dimension 0)."""
        from monarch._src.tensor.reduce import reduce_tensor  # needs torch.distributed, only once used

        return reduce_tensor(self, dims, reduction, scatter, mesh, _inplace, out)

    def to_mesh(self, mesh: ProcMesh) -> Tensor:
        """This tensor on ``mesh``: the same procs, or some of them (``monarch.to_mesh``)."""
        from monarch._src.tensor.api import to_mesh  # the api module builds on this one

        return to_mesh(self, mesh)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Sent to an actor of the same procs: it gets its proc's shard once the proc's worker
        # ran every batch sent before the call (ops issued before it, in place ones included);
        # the value is pinned for it, as this handle may be freed before the actor takes it.
        # Sent in an endpoint call, the shard is lent to the actor until its endpoint ends: the
        # worker of each proc the call goes to runs no later op until then (issue order).
        ctx = self.context
        controller = ctx.controller
        sending = pickling_for.get()
        lent_to = None if sending is None else (sending[0], frozenset(a for _, a in sending[1]))
        with controller.lock:
            pin_id = next(controller.ids)
            controller.record_command(ctx, (PIN, self.ref_id, pin_id, lent_to))
            controller.flush()
            batches = {r: controller.batches_sent[r] for r in ctx.root_ranks}
        return (local_shard, (controller.key, pin_id, batches))

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        with torch._C.DisableTorchFunctionSubclass():
            shape, dtype = tuple(self.shape), self.dtype
        return f"monarch.Tensor(id={self.ref_id}, shape={shape}, dtype={dtype}, mesh={self.context!r})"

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)


# -- the active mesh ------------------------------------------------------------------------------

_state = threading.local()


def _stack() -> list[MeshContext | None]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    return stack


def active_context() -> MeshContext | None:
    """The mesh of the innermost ``activate()`` in this thread (None: none, or ``no_mesh``)."""
    stack = _stack()
    return stack[-1] if stack else None


@contextmanager
def on_client() -> Iterator[None]:
    """Plain torch on meta tensors here, whatever mesh is active: shapes of results, no ops sent."""
    stack = _stack()
    stack.append(None)
    try:
        with torch._C.DisableTorchFunctionSubclass(), torch.device("meta"):
            yield
    finally:
        stack.pop()


class _Activation(TorchFunctionMode):
    """Routes every torch call made while a mesh is active through ``dispatch``."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        ctx = active_context()
        if ctx is None:  # monarch.no_mesh is active inside: plain torch
            return func(*args, **(kwargs or {}))
        return dispatch(func, args, kwargs or {}, ctx)


@contextmanager
def activation(ctx: MeshContext | None) -> Iterator[None]:
    """Make ``ctx`` the active mesh of this thread (None: no mesh) until the block ends."""
    stack = _stack()
    stack.append(ctx)
    mode = _Activation()
    try:
        with mode:
            yield
    finally:
        stack.pop()
        if ctx is not None:
            ctx.controller.flush()


def activate(mesh: ProcMesh) -> Any:
    """``ProcMesh.activate()``: torch ops in the block make distributed tensors on ``mesh``."""
    return activation(controller_for(mesh).context(mesh))


# -- running an op ------------------------------------------------------------------------------


def _tensors(value: Any, found: list[torch.Tensor]) -> None:
    """Collect the tensors in ``value`` (tuples, lists, dicts walked: what torch calls take;
    a plain walk, as torch's pytree costs most of an op's time here)."""
    kind = type(value)
    if kind is tuple or kind is list:
        for v in value:
            _tensors(v, found)
    elif kind is dict:
        for v in value.values():
            _tensors(v, found)
    elif isinstance(value, torch.Tensor):
        found.append(value)


def handles_in(args: tuple, kwargs: dict) -> list[Tensor]:
    found: list[torch.Tensor] = []
    _tensors(args, found)
    if kwargs:
        _tensors(kwargs, found)
    return [t for t in found if type(t) is Tensor]  # type: ignore[misc]


def _has_tensor(args: tuple, kwargs: dict) -> bool:
    found: list[torch.Tensor] = []
    _tensors((args, kwargs), found)
    return bool(found)


def to_refs(value: Any) -> Any:
    """``value`` as shipped: handles replaced by their ids (tuples, lists, dicts walked)."""
    if type(value) is Tensor:
        return Ref(value.ref_id)
    if type(value) in (tuple, list):
        return type(value)(to_refs(v) for v in value)
    if type(value) is dict:
        return {k: to_refs(v) for k, v in value.items()}
    return value


def to_meta(value: Any) -> Any:
    """``value`` for the local shape computation: client tensors become meta tensors."""
    if isinstance(value, torch.Tensor) and type(value) is not Tensor and value.device.type != "meta":
        return value.to("meta")
    if type(value) in (tuple, list):
        return type(value)(to_meta(v) for v in value)
    if type(value) is dict:
        return {k: to_meta(v) for k, v in value.items()}
    return value


def context_of(handles: list[Tensor], active: MeshContext | None) -> MeshContext:
    """The one mesh an op runs on: the active one, which every input must live on."""
    ctx = active if active is not None else handles[0].context
    for h in handles:
        if h.context is not ctx:
            raise ValueError(
                f"a tensor on mesh {h.context!r} (procs {h.context.root_ranks}) is used with "
                f"{'the active mesh' if active is not None else 'a tensor on mesh'} {ctx!r} (procs {ctx.root_ranks})\n"
                "HINT: move it first with monarch.to_mesh(t, mesh) or monarch.slice_mesh(t, ...)."
            )
    return ctx


def dispatch(func: Any, args: tuple, kwargs: dict, active: MeshContext | None) -> Any:
    """Run a torch call on distributed tensors: shapes here, values on the procs."""
    handles = handles_in(args, kwargs)
    if func in _NEEDS_VALUES and handles:
        raise RuntimeError(
            f"{getattr(func, '__name__', func)}() needs the values of a distributed tensor, which live on "
            "the mesh's procs\nHINT: copy a shard here first: monarch.inspect(t) or "
            "monarch.fetch_shard(t, **coords).get()."
        )
    if not handles and (active is None or (func not in _DATA_FACTORIES and _has_tensor(args, kwargs))):
        return func(*args, **kwargs)  # client tensors only: a local op, even under activate()
    ctx = context_of(handles, active)
    with torch._C.DisableTorchFunctionSubclass():
        result = meta_result(func, args, kwargs, handles)
    return record(ctx, func, args, kwargs, result, handles)


# -- result shapes --------------------------------------------------------------------------------

#: (op, the arguments' metadata) -> how to rebuild its result: running an op on meta tensors
#: costs hundreds of microseconds (Python decompositions), rebuilding a known result a few.
_results: dict[tuple, tuple] = {}
_RESULTS_LIMIT = 4096


def _key(value: Any) -> Any:
    """What an op's result shape can depend on in ``value``; TypeError if it cannot be a key."""
    kind = type(value)
    if kind is Tensor:  # a handle: on meta
        return (kind, value.shape, value.dtype, value.stride())
    if isinstance(value, torch.Tensor):
        return (torch.Tensor, value.shape, value.dtype, value.stride(), value.device.type)
    if kind is tuple or kind is list:
        return (kind, tuple(_key(v) for v in value))
    if kind is dict:
        return (dict, tuple((k, _key(v)) for k, v in value.items()))
    if kind is slice:
        return (slice, _key(value.start), _key(value.stop), _key(value.step))
    hash(value)
    return (kind, value)  # the type too: 1 and True (and 1.0) give results of different dtypes


def _describe(result: Any, handles: list[Tensor]) -> tuple:
    leaves, spec = pytree.tree_flatten(result)
    described: list[tuple] = []
    for leaf in leaves:
        if type(leaf) is Tensor:
            described.append(("same", next(i for i, h in enumerate(handles) if h is leaf)))
        elif isinstance(leaf, torch.Tensor):
            described.append(("new", tuple(leaf.shape), leaf.stride(), leaf.dtype))
        else:
            described.append(("value", leaf))
    return spec, described


def _rebuild(entry: tuple, handles: list[Tensor]) -> Any:
    spec, described = entry
    leaves = []
    for d in described:
        if d[0] == "same":
            leaves.append(handles[d[1]])
        elif d[0] == "new":
            leaves.append(torch.empty_strided(d[1], d[2], dtype=d[3], device="meta"))
        else:
            leaves.append(d[1])
    return pytree.tree_unflatten(leaves, spec)


def meta_result(func: Any, args: tuple, kwargs: dict, handles: list[Tensor]) -> Any:
    """What ``func`` returns on meta tensors shaped like its arguments (handles stand as themselves)."""
    try:
        key: tuple | None = (func, _key(args), _key(kwargs), torch.get_default_dtype())
    except TypeError:  # an argument that is no key (unhashable): compute every time
        key = None
    entry = _results.get(key) if key is not None else None
    if entry is not None:
        return _rebuild(entry, handles)
    meta_args = to_meta(args)
    meta_kwargs = to_meta(kwargs)
    if "device" in meta_kwargs:
        meta_kwargs["device"] = "meta"
    if func in _DEVICE_MOVES:
        meta_args, meta_kwargs = _moved_to_meta(func, meta_args, meta_kwargs)
        func = torch.Tensor.to
    with torch.device("meta"):
        result = func(*meta_args, **meta_kwargs)
    if key is not None:
        if len(_results) >= _RESULTS_LIMIT:
            _results.clear()
        _results[key] = _describe(result, handles)
    return result


def _moved_to_meta(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of ``Tensor.to`` that give a device move's result shape and dtype on meta."""
    if func is not torch.Tensor.to:  # cuda(...), cpu(): same dtype
        return (args[0], "meta"), {"copy": True}
    moved = tuple("meta" if isinstance(a, (str, torch.device)) or type(a) is int else a for a in args[1:])
    return (args[0], *moved), {**kwargs, "copy": True}


def record(
    ctx: MeshContext, fn: Callable[..., Any], args: tuple, kwargs: dict, result: Any, inputs: list[Tensor]
) -> Any:
    """Queue ``fn`` for the procs of ``ctx`` and return ``result`` (its meta value) with a handle
    for each tensor in it."""
    if type(result) is torch.Tensor:  # most ops: one new tensor
        return _record_one(ctx, fn, args, kwargs, result)
    leaves, spec = pytree.tree_flatten(result)
    tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if not tensor_at:
        if (result is None and inputs) or fn in _REMOTE_EFFECTS:  # a mutation (t[0] = 1): ship it
            ctx.controller.record(ctx, fn, to_refs(args), to_refs(kwargs), [])
        return result
    controller: Controller = ctx.controller
    with controller.lock:
        ids = []
        for i in tensor_at:
            leaf = leaves[i]
            if type(leaf) is Tensor:  # in place (t.add_(1), out=t): the same handle, the same id
                ids.append(leaf.ref_id)
            else:
                ref_id = next(controller.ids)
                ids.append(ref_id)
                leaves[i] = Tensor.wrap(leaf, ctx, ref_id)
        controller.record(ctx, fn, to_refs(args), to_refs(kwargs), ids)
    if active_context() is None:  # no activate() block to end the batch: send it now
        controller.flush()
    return pytree.tree_unflatten(leaves, spec)


def _record_one(
    ctx: MeshContext, fn: Callable[..., Any], args: tuple, kwargs: dict, meta: torch.Tensor
) -> Tensor:
    controller: Controller = ctx.controller
    with controller.lock:
        ref_id = next(controller.ids)
        handle = Tensor.wrap(meta, ctx, ref_id)
        controller.record(ctx, fn, to_refs(args), to_refs(kwargs) if kwargs else kwargs, [ref_id])
    if active_context() is None:  # no activate() block to end the batch: send it now
        controller.flush()
    return handle
