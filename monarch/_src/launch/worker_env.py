"""The environment each worker sees: exactly torchrun's, computed as a pure function.

Training scripts read their identity from environment variables (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` ...) and libraries probe others
(``TORCHELASTIC_RUN_ID`` makes ``torch.distributed.is_torchelastic_launched()``
true; ``TORCHELASTIC_USE_AGENT_STORE`` decides whether worker rank 0 hosts the
TCPStore). So being a drop-in torchrun means reproducing the variables byte for
byte. torchrun builds them inside ``LocalElasticAgent._start_workers``; here it
is a function of its inputs, so it can be tested without starting anything and
the runtime decides only the things that are genuinely runtime facts (the
master port it bound, the attempt number, the error-file path).

Multi-node needs no other code path: pass ``node_rank``/``group_world_size``
(and, for nodes with different ``--nproc-per-node``, the rank offsets that the
rendezvous computed).
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any

from .config import LaunchConfig, LaunchConfigError

__all__ = [
    "OMP_BANNER",
    "default_master_addr",
    "error_file_path",
    "needs_omp_banner",
    "timer_file_path",
    "worker_env_vars",
    "worker_environ",
]

#: What torchrun logs (at WARNING) when it defaults OMP_NUM_THREADS to 1.
OMP_BANNER = (
    "\n*****************************************\n"
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
    "to avoid your system being overloaded, please further tune the variable for optimal "
    "performance in your application as needed. \n"
    "*****************************************"
)


def needs_omp_banner(config: LaunchConfig, parent_env: Mapping[str, str] | None = None) -> bool:
    """True when the launcher should print :data:`OMP_BANNER` (once per run).

    torchrun does so, and exports ``OMP_NUM_THREADS=1``, only when the variable
    is unset in its own environment and there is more than one local worker:
    several workers each using every core would oversubscribe the machine.
    """
    env = os.environ if parent_env is None else parent_env
    return "OMP_NUM_THREADS" not in env and config.nproc_per_node > 1


def default_master_addr(config: LaunchConfig) -> str:
    """The ``MASTER_ADDR`` torchrun would give workers, seen from node rank 0.

    Static backend: ``--master-addr``. c10d (including ``--standalone`` and the
    implicit single-node default): the address of the node that won group
    rank 0, that is its ``--local-addr`` or, failing that, its FQDN. Only the
    rank-0 node can call this meaningfully for c10d; other nodes learn the
    value through the rendezvous.
    """
    if config.rdzv_backend == "static":
        return config.master_addr
    return config.local_addr or socket.getfqdn()


def error_file_path(config: LaunchConfig, attempt_dir: str, local_rank: int) -> str:
    """``TORCHELASTIC_ERROR_FILE`` for one worker of one attempt.

    torchrun puts it at ``<attempt_dir>/<local_rank>/error.json`` whether or
    not ``--log-dir`` was given, and exports ``""`` when ``--log-dir`` is
    ``/dev/null`` (no files at all).
    """
    if config.log_dir == os.devnull:
        return ""
    return os.path.join(attempt_dir, str(local_rank), "error.json")


def timer_file_path(parent_env: Mapping[str, str] | None = None) -> str | None:
    """The ``TORCHELASTIC_TIMER_FILE`` for one attempt, or ``None``.

    torchrun's named-pipe watchdog is opt-in: with
    ``TORCHELASTIC_ENABLE_FILE_TIMER=1`` and no ``TORCHELASTIC_TIMER_FILE`` it
    invents ``$TMPDIR/watchdog_timer_<uuid4>`` (a new one each attempt). A
    ``TORCHELASTIC_TIMER_FILE`` already set is passed on even when the watchdog
    is off. Whoever exports the path must also serve the pipe, or workers that
    use ``FileTimerClient`` will fail; that is the runtime's decision.
    """
    env = os.environ if parent_env is None else parent_env
    path = env.get("TORCHELASTIC_TIMER_FILE")
    if env.get("TORCHELASTIC_ENABLE_FILE_TIMER") == "1" and path is None:
        path = os.path.join(tempfile.gettempdir(), f"watchdog_timer_{uuid.uuid4()}")
    return path


def worker_env_vars(
    config: LaunchConfig,
    local_rank: int,
    *,
    master_addr: str,
    master_port: int,
    error_file: str,
    node_rank: int = 0,
    restart_count: int = 0,
    run_id: str | None = None,
    group_world_size: int | None = None,
    rank_offset: int | None = None,
    world_size: int | None = None,
    role_rank_offset: int | None = None,
    role_world_size: int | None = None,
    use_agent_store: bool = True,
    timer_file: str | None = None,
    parent_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables torchrun adds to (or overrides in) one worker's environment.

    The result goes on top of a copy of the launcher's environment (see
    :func:`worker_environ`); these keys win over inherited ones.

    :param config: the validated launch configuration.
    :param local_rank: the worker's index on this node, ``0 <= local_rank < nproc_per_node``.
    :param master_addr: address of the TCPStore workers connect to
        (see :func:`default_master_addr`).
    :param master_port: its port. torchrun exports whatever it was given, even
        ``0`` with ``--master-port=0``.
    :param error_file: ``TORCHELASTIC_ERROR_FILE`` (see :func:`error_file_path`).
    :param node_rank: ``GROUP_RANK``: this node's rank in the rendezvous.
    :param restart_count: ``TORCHELASTIC_RESTART_COUNT``: failures-restarts used so
        far by *this* node (membership changes do not count).
    :param run_id: ``TORCHELASTIC_RUN_ID``; default ``config.rdzv_id``.
    :param group_world_size: nodes in this rendezvous round; default
        ``config.max_nodes`` for fixed-size jobs. Required for elastic
        ``MIN:MAX`` jobs, where only the rendezvous knows it.
    :param rank_offset: global rank of this node's local rank 0: the sum of the
        local world sizes of lower group ranks. Default ``node_rank * nproc_per_node``.
    :param world_size: ``WORLD_SIZE``; default ``group_world_size * nproc_per_node``.
    :param role_rank_offset: like ``rank_offset`` over nodes with the same role;
        default ``rank_offset`` (every node has the same role).
    :param role_world_size: ``ROLE_WORLD_SIZE``; default ``world_size``.
    :param use_agent_store: ``TORCHELASTIC_USE_AGENT_STORE``. ``True`` promises that
        a TCPStore is already served at master_addr:master_port (workers then
        only connect as clients); ``False`` makes worker rank 0 host it.
    :param timer_file: ``TORCHELASTIC_TIMER_FILE`` (see :func:`timer_file_path`).
    :param parent_env: the launcher's environment; ``None`` = ``os.environ``.
        Consulted for ``TORCH_NCCL_ASYNC_ERROR_HANDLING``, ``OMP_NUM_THREADS``
        and ``CUDA_VISIBLE_DEVICES``.
    :raises ValueError: inconsistent rank arguments.
    :raises LaunchConfigError: ``--virtual-local-rank`` with fewer
        ``CUDA_VISIBLE_DEVICES`` entries than local workers (torchrun: ValueError
        when it starts the workers).
    """
    env = os.environ if parent_env is None else parent_env
    nproc = config.nproc_per_node
    if not 0 <= local_rank < nproc:
        raise ValueError(f"local_rank {local_rank} is outside 0..{nproc - 1}")
    if group_world_size is None:
        if config.min_nodes != config.max_nodes:
            raise ValueError(
                f"group_world_size is required for an elastic job (--nnodes="
                f"{config.min_nodes}:{config.max_nodes}); pass the size of this round"
            )
        group_world_size = config.max_nodes
    if not 0 <= node_rank < group_world_size:
        raise ValueError(f"node_rank {node_rank} is outside 0..{group_world_size - 1}")
    if rank_offset is None:
        rank_offset = node_rank * nproc
    if world_size is None:
        world_size = group_world_size * nproc
    if role_rank_offset is None:
        role_rank_offset = rank_offset
    if role_world_size is None:
        role_world_size = world_size
    rank = rank_offset + local_rank
    if not 0 <= rank < world_size:
        raise ValueError(f"RANK {rank} is outside 0..{world_size - 1}")

    # Same keys, same order as torchrun's LocalElasticAgent._start_workers.
    out: dict[str, str] = {
        "RANK": str(rank),
        "GROUP_RANK": str(node_rank),
        "ROLE_RANK": str(role_rank_offset + local_rank),
        "ROLE_NAME": config.role,
        "LOCAL_WORLD_SIZE": str(nproc),
        "WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": str(group_world_size),
        "ROLE_WORLD_SIZE": str(role_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        "TORCHELASTIC_RUN_ID": config.rdzv_id if run_id is None else run_id,
        # str(bool), i.e. "True"/"False", because that is what torchrun writes.
        "TORCHELASTIC_USE_AGENT_STORE": str(bool(use_agent_store)),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if config.virtual_local_rank:
        out["LOCAL_RANK"] = "0"
        parent_devices = env.get("CUDA_VISIBLE_DEVICES")
        if parent_devices is not None:
            devices = parent_devices.split(",")
            if local_rank >= len(devices):
                raise LaunchConfigError(
                    f"local_rank {local_rank} exceeds available GPUs in "
                    f"CUDA_VISIBLE_DEVICES={parent_devices}",
                    hint="list at least --nproc-per-node devices in CUDA_VISIBLE_DEVICES",
                )
            out["CUDA_VISIBLE_DEVICES"] = devices[local_rank].strip()
        else:
            out["CUDA_VISIBLE_DEVICES"] = str(local_rank)
    else:
        out["LOCAL_RANK"] = str(local_rank)
        if "CUDA_VISIBLE_DEVICES" in env:
            out["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    # torchrun puts OMP_NUM_THREADS=1 into its own environment when it is unset
    # and there are several local workers; a user value always passes through.
    if "OMP_NUM_THREADS" in env:
        out["OMP_NUM_THREADS"] = env["OMP_NUM_THREADS"]
    elif nproc > 1:
        out["OMP_NUM_THREADS"] = "1"
    out["TORCHELASTIC_ERROR_FILE"] = error_file
    if timer_file is not None:
        out["TORCHELASTIC_TIMER_FILE"] = timer_file
    # torchrun exports this into its own os.environ, so every worker inherits it.
    out["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
    return out


def worker_environ(
    config: LaunchConfig,
    local_rank: int,
    *,
    parent_env: Mapping[str, str] | None = None,
    **worker_vars: Any,
) -> dict[str, str]:
    """The complete environment of one worker: the launcher's, plus :func:`worker_env_vars`.

    torchrun passes its whole ``os.environ`` down (``PET_*``, ``PATH``,
    ``CUDA_VISIBLE_DEVICES``, ``PYTHONUNBUFFERED`` ...) and lays the per-worker
    keys on top; so do we. Keyword arguments are those of :func:`worker_env_vars`.
    """
    env = os.environ if parent_env is None else parent_env
    full = dict(env)
    full.update(worker_env_vars(config, local_rank, parent_env=env, **worker_vars))
    return full
