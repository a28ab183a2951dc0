"""Reductions across mesh dimensions, and ``rank_tensor``.

On the client a reduction is one more op: its result shape is known here, and each proc is
told the groups of procs that reduce together (those equal on every dimension not reduced).
On the procs it runs on torch.distributed: at the first reduction of an engine every proc of
its root mesh joins one process group (gloo, and NCCL for CUDA tensors where torch has it,
through a TCP store the client runs), and each set of procs that reduces together gets its own
subgroup, created when first used by its members only.

NCCL needs one GPU per rank: procs that share one (several procs of a one-GPU machine, none
given its own ``CUDA_VISIBLE_DEVICES``) reduce CUDA tensors over gloo instead, through host
memory, which is slower but gives the same values. Each proc tells the store which GPU it would
use (its machine, ``CUDA_VISIBLE_DEVICES`` and current device) when it joins, before any CUDA
context exists, and every proc makes the same choice from the same list.

Procs of other hosts reach the store at the client's address toward them (its runtime's own
TCP address when it has one), and gloo talks on the interface of each proc's own TCP address
(unless ``GLOO_SOCKET_IFNAME`` says otherwise): the host name, gloo's default, may resolve to
an address the other hosts cannot reach, or to none of this host's.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from monarch._src.actor.proc_mesh import ProcMesh
from monarch._src.actor.process_state import runtime
from monarch._src.tensor.controller import Controller, MeshContext, controller_for
from monarch._src.tensor.tensor import Tensor, active_context, on_client, record
from monarch._src.tensor.worker import root_rank
from monarch._src.transport.address import TcpAddress, address_toward, interface_of, is_unix, parse

#: Monarch's reduction names; ``stack`` gathers instead of combining.
REDUCTIONS = ("stack", "sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def _dims(ctx: MeshContext, dims: str | list[str] | tuple[str, ...]) -> list[str]:
    names = [dims] if isinstance(dims, str) else list(dims)
    labels = ctx.extent.labels
    unknown = [d for d in names if d not in labels]
    if unknown or not names:
        raise ValueError(f"cannot reduce over {names}: the tensor's mesh has dimensions {dict(ctx.extent)}")
    return names


def groups(ctx: MeshContext, dims: list[str]) -> tuple[tuple[int, ...], ...]:
    """The root ranks of the procs that reduce together, each group in row-major order of ``dims``."""
    found: dict[tuple[int, ...], list[int]] = {}
    for rank in range(len(ctx.addresses)):
        coords = ctx.coordinates(rank)
        key = tuple(v for k, v in coords.items() if k not in dims)
        found.setdefault(key, []).append(ctx.root_ranks[rank])
    return tuple(tuple(g) for g in found.values())


def ensure_world(controller: Controller) -> None:
    """Queue, once per engine, the op that makes every proc of the root mesh join one process
    group, whose rendezvous store lives here, in the client (it goes when the client goes)."""
    import torch.distributed as dist

    with controller.lock:
        if controller.world_store is not None:
            return
        host = store_host(controller.root_addresses)
        size = len(controller.root_addresses)
        controller.world_store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False)
        controller.record(controller.root_ctx, join_world, (host, controller.world_store.port, size), {}, [])


def store_host(proc_addresses: tuple[str, ...]) -> str:
    """The address at which the procs reach the client's rendezvous store: loopback for procs of
    this host only, else the client's own TCP address (the procs reach its runtime there), else
    its address on the route toward them."""
    remote = [parse(a) for a in proc_addresses if not is_unix(a)]
    if not remote:
        return "127.0.0.1"
    own = parse(runtime().address)
    if isinstance(own, TcpAddress):
        return own.host
    peer = remote[0]
    assert isinstance(peer, TcpAddress)
    return address_toward(peer.host)


def reduce_tensor(
    t: Tensor,
    dims: str | list[str] | tuple[str, ...],
    reduction: str,
    scatter: bool,
    mesh: ProcMesh | None,
    inplace: bool,
    out: Tensor | None,
) -> Tensor:
    """``Tensor.reduce``: queue the collective and return the handle of its result."""
    ctx = t.context
    if mesh is not None and tuple(mesh.proc_addresses()) != ctx.addresses:
        raise NotImplementedError(
            "reduce(mesh=...) onto another mesh is not supported; reduce, then monarch.to_mesh"
        )
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; Monarch's reductions are {', '.join(REDUCTIONS)}")
    names = _dims(ctx, dims)
    n = 1
    for d in names:
        n *= ctx.extent[d]
    shape = tuple(t.shape)
    if reduction == "stack":
        if scatter:
            raise NotImplementedError("reduce('stack', scatter=True) is not supported; use stack, then index")
        shape = (n, *shape)
    elif scatter:
        if not shape or shape[0] % n:
            raise ValueError(
                f"scatter=True splits dimension 0 ({shape[:1]}) evenly over {n} procs; it does not divide"
            )
        shape = (shape[0] // n, *shape[1:])
    if (inplace or out is not None) and shape != tuple(t.shape):
        raise ValueError(
            f"an in-place reduction keeps the shape {tuple(t.shape)}, but {reduction} gives {shape}"
        )
    target = out if out is not None else t if inplace else None
    ensure_world(ctx.controller)
    with on_client():
        result: Any = target if target is not None else torch.empty(shape, dtype=t.dtype, device="meta")
    args = (t, groups(ctx, names), reduction, scatter, target)
    return record(ctx, collective, args, {}, result, [t])


# -- on the procs -------------------------------------------------------------------------------

_subgroups: dict[tuple[int, ...], Any] = {}


def join_world(store_host: str, store_port: int, world_size: int) -> None:
    """Join the engine's process group as this proc's root rank (an op run on every proc)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    own = parse(runtime().address)
    if isinstance(own, TcpAddress) and "GLOO_SOCKET_IFNAME" not in os.environ:
        interface = interface_of(own.host)
        if interface is not None:  # gloo (this group and its subgroups) talks where the proc listens
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    store = dist.TCPStore(store_host, store_port, world_size, is_master=False)
    global _nccl
    _nccl = dist.is_nccl_available() and torch.cuda.is_available() and _own_gpus(store, world_size)
    # CUDA tensors reduce over NCCL where every proc has a GPU of its own; CPU tensors over gloo.
    backend = "cpu:gloo,cuda:nccl" if _nccl else "gloo"
    dist.init_process_group(backend, store=store, rank=root_rank(), world_size=world_size)


#: Whether this proc's process group reduces CUDA tensors over NCCL (else: staged through gloo).
_nccl = False


def _own_gpus(store: Any, world_size: int) -> bool:
    """Whether no two procs of the world would use the same GPU, judged without making a CUDA
    context (a proc that never touches CUDA should not pay for one). One kernel (boot id) is
    one machine, whose GPUs its processes share whatever their namespaces."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        machine = f.read().strip()
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    parts = visible.split(",") if visible else [str(i) for i in range(device + 1)]
    gpu = parts[device] if device < len(parts) else f"#{device}"
    store.set(f"monarch/gpu/{root_rank()}", f"{machine}|{gpu}")
    keys = [f"monarch/gpu/{rank}" for rank in range(world_size)]
    store.wait(keys)
    gpus = [store.get(key) for key in keys]
    return len(set(gpus)) == len(gpus)


def _subgroup(members: tuple[int, ...]) -> Any:
    import torch.distributed as dist

    group = _subgroups.get(members)
    if group is None:
        if len(members) == dist.get_world_size():
            group = dist.group.WORLD
        else:
            group = dist.new_group(list(members), use_local_synchronization=True)
        _subgroups[members] = group
    return group


def collective(
    t: torch.Tensor,
    groups: tuple[tuple[int, ...], ...],
    reduction: str,
    scatter: bool,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """One proc's part of a reduction among the procs of its group."""
    import torch.distributed as dist

    me = root_rank()
    members = next(g for g in groups if me in g)
    group = _subgroup(members) if len(members) > 1 else None
    n = len(members)
    device = t.device
    if group is not None and device.type != "cpu" and not (_nccl and device.type == "cuda"):
        t = t.cpu()  # reduced over gloo in host memory, the result moved back below
    if reduction == "stack":
        parts = [torch.empty_like(t) for _ in range(n)]
        if group is None:
            parts = [t.clone()]
        else:
            dist.all_gather(parts, t.contiguous(), group=group)
        result = torch.stack(parts)
    else:
        result = t.clone()
        if group is not None:
            op = {
                "sum": dist.ReduceOp.SUM,
                "avg": dist.ReduceOp.SUM,
                "product": dist.ReduceOp.PRODUCT,
                "min": dist.ReduceOp.MIN,
                "max": dist.ReduceOp.MAX,
                "band": dist.ReduceOp.BAND,
                "bor": dist.ReduceOp.BOR,
                "bxor": dist.ReduceOp.BXOR,
            }[reduction]
            dist.all_reduce(result, op=op, group=group)
        if reduction == "avg":
            result = result / n if result.is_floating_point() else result // n
        if scatter:
            result = result.chunk(n)[members.index(me)].clone()
    result = result.to(device)  # no copy unless staged
    if out is not None:
        out.copy_(result)
        return out
    return result


# -- rank_tensor ----------------------------------------------------------------------------------


def rank_tensor(mesh: ProcMesh, dim: str | list[str]) -> Tensor:
    """``ProcMesh.rank_tensor``: each proc's row-major index along ``dim`` as an int64 scalar."""
    ctx = active_context()
    if ctx is None or tuple(mesh.proc_addresses()) != ctx.addresses:
        ctx = controller_for(mesh).context(mesh)
    names = _dims(ctx, dim)
    values: dict[int, int] = {}
    for rank in range(len(ctx.addresses)):
        coords = ctx.coordinates(rank)
        index = 0
        for d in names:
            index = index * ctx.extent[d] + coords[d]
        values[ctx.root_ranks[rank]] = index
    with on_client():
        meta = torch.empty((), dtype=torch.int64, device="meta")
    return record(ctx, rank_value, (values,), {}, meta, [])


def rank_value(values: dict[int, int]) -> torch.Tensor:
    """This proc's entry of ``values`` (by root rank), as a tensor."""
    return torch.tensor(values[root_rank()], dtype=torch.int64)
