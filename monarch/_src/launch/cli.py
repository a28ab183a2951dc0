"""Command-line front end of ``python -m monarch.launch``: torchrun's flags.

The goal is that any torchrun 2.13 command line can be run by replacing
``torchrun`` with ``python -m monarch.launch`` and gets the same parse:

* every flag and alias (``--nproc-per-node`` and ``--nproc_per_node``), the same
  defaults, the same argparse behaviour (prefix abbreviations, exit code 2 on
  syntax errors, everything after the script passed through untouched);
* the ``PET_<DEST>`` environment fallbacks with torchrun's precedence
  (command line > ``PET_*`` > default), read when the parser is *built*, as
  torchrun reads them;
* the semantic checks torchrun makes after parsing (bad ``--nnodes``,
  ``--nproc-per-node=gpu`` without CUDA, bad ``--rdzv-conf`` ...), in
  torchrun's order so that the first error reported is the same one. They
  raise :class:`~.config.LaunchConfigError`; :func:`parse_args_or_exit` turns
  that into a message and exit code 1 (torchrun: traceback and exit code 1).

This module must not import torch: CUDA is detected from the driver
(``/proc/driver/nvidia`` or ``nvidia-smi``), CPUs from the affinity mask.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from .config import (
    LaunchConfig,
    LaunchConfigError,
    parse_rdzv_bool,
    parse_std,
    std_to_map,
)

__all__ = [
    "NUMA_BINDING_CHOICES",
    "build_parser",
    "config_from_namespace",
    "cpu_count",
    "cuda_device_count",
    "parse_args",
    "parse_args_or_exit",
    "parse_rendezvous_endpoint",
    "resolve_nproc_per_node",
]

PROG = "python -m monarch.launch"

#: torch.numa.binding.AffinityMode values accepted by ``--numa-binding``.
NUMA_BINDING_CHOICES: tuple[str, ...] = ("node", "socket", "exclusive", "core-complex")

#: Rendezvous backends torchrun knows without plugins.
_TORCHRUN_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")

_DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
_C10D_DEFAULT_PORT = 29400
_STATIC_DEFAULT_PORT = 29500
#: ``--preload`` values that are not module names: the default (decide per run), and off.
PRELOAD_AUTO, PRELOAD_NONE = "auto", "none"
_DEFAULT_RDZV_TIMEOUT = 900


# ---------------------------------------------------------------------------
# argparse actions with PET_* fallbacks
# ---------------------------------------------------------------------------


class _PetValue(argparse.Action):
    """Store a value; its default comes from ``PET_<DEST>`` when that is set.

    Same rule as torchrun's ``env`` action: the variable is read once, when
    the parser is built, and replaces the default *string*; argparse then
    converts it with ``type`` like any default string, so ``PET_MAX_RESTARTS=x``
    is an argparse error (exit 2) only when ``--max-restarts`` is not given.
    An empty variable counts as set (it replaces the default with ``""``).
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        default: Any = None,
        required: bool = False,
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        env = os.environ if environ is None else environ
        default = env.get(f"PET_{dest.upper()}", default)
        if default:
            required = False
        super().__init__(option_strings, dest, default=default, required=required, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)


class _PetFlag(argparse.Action):
    """A ``store_true`` flag whose default is ``bool(int(PET_<DEST>))``.

    Mirrors torchrun's ``check_env``: ``PET_STANDALONE=1`` turns the flag on,
    ``0`` leaves it off, and giving the flag always turns it on. A value that
    is not an integer is an error when the parser is built (torchrun crashes
    with ``ValueError``; we raise :class:`LaunchConfigError`).
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        default: bool = False,
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        env = os.environ if environ is None else environ
        name = f"PET_{dest.upper()}"
        raw = env.get(name, "1" if default else "0")
        try:
            value = bool(int(raw))
        except ValueError:
            raise LaunchConfigError(
                f"invalid literal for int() with base 10: {raw!r}",
                hint=f"{name} must be an integer: 1 turns {option_strings[-1]} on, 0 leaves it off",
            ) from None
        super().__init__(option_strings, dest, const=True, default=value, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, self.const)


def _comma_list(value: str) -> list[str]:
    """Split on commas, with ``,,`` standing for a literal comma (torchrun's rule)."""
    marker = "\x00"
    return [item.replace(marker, ",") for item in value.replace(",,", marker).split(",")]


# ---------------------------------------------------------------------------
# the parser
# ---------------------------------------------------------------------------


def build_parser(
    environ: Mapping[str, str] | None = None, *, prog: str | None = PROG
) -> argparse.ArgumentParser:
    """Build the argument parser, reading ``PET_*`` defaults from ``environ``.

    The namespace it produces has the same ``dest`` names, values and types as
    torchrun's (``torch.distributed.run.get_args_parser()``), plus four dests
    of our own: ``kill_grace_period``, ``hang_timeout``, ``summary`` and ``preload``.

    :param environ: where ``PET_*`` come from; ``None`` means ``os.environ``.
        Passing it explicitly keeps tests and embedders free of global state.
    :param prog: program name shown in usage and errors.
    :raises LaunchConfigError: a boolean ``PET_*`` variable is not an integer.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a training script on N workers per node, torchrun-compatible, "
        "without importing torch in the launcher.",
        add_help=False,
    )

    def value(*flags: str, **kwargs: Any) -> None:
        parser.add_argument(*flags, action=_PetValue, environ=env, **kwargs)

    def flag(*flags: str, **kwargs: Any) -> None:
        parser.add_argument(*flags, action=_PetFlag, environ=env, **kwargs)

    parser.add_argument("-h", "--help", action="help", help="show this help message and exit")
    # torchrun has no other option starting with "--h", so "--h" means --help
    # there; our --hang-timeout would make it ambiguous. An exact hidden alias
    # keeps the old meaning.
    parser.add_argument("--h", action="help", help=argparse.SUPPRESS)

    # Sizes.
    value("--nnodes", type=str, default="1:1", help="Node count N, or an elastic range MIN:MAX. (PET_NNODES)")
    value(
        "--nproc-per-node",
        "--nproc_per_node",
        type=str,
        default="1",
        help="Workers on this node: an integer, or cpu, gpu, xpu, auto. (PET_NPROC_PER_NODE)",
    )

    # Rendezvous.
    value(
        "--rdzv-backend",
        "--rdzv_backend",
        type=str,
        default="static",
        help="Rendezvous backend: static or c10d. (PET_RDZV_BACKEND)",
    )
    value(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        type=str,
        default="",
        help="Rendezvous address, host[:port]. (PET_RDZV_ENDPOINT)",
    )
    value(
        "--rdzv-id",
        "--rdzv_id",
        type=str,
        default="none",
        help="Job id shared by all nodes; becomes TORCHELASTIC_RUN_ID. (PET_RDZV_ID)",
    )
    value(
        "--rdzv-conf",
        "--rdzv_conf",
        type=str,
        default="",
        help="Extra rendezvous settings, key1=v1,key2=v2. (PET_RDZV_CONF)",
    )
    flag(
        "--standalone",
        help="Single node: use a private rendezvous on a free local port; overrides "
        "--rdzv-backend/--rdzv-endpoint/--rdzv-id. (PET_STANDALONE)",
    )

    # Running user code.
    value(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=0,
        help="Times the worker group is restarted after a failure. (PET_MAX_RESTARTS)",
    )
    value(
        "--monitor-interval",
        "--monitor_interval",
        type=float,
        default=0.1,
        help="Seconds between checks of worker state. (PET_MONITOR_INTERVAL)",
    )
    value(
        "--start-method",
        "--start_method",
        type=str,
        default="spawn",
        choices=["spawn", "fork", "forkserver"],
        help="Start method for --run-path workers. (PET_START_METHOD)",
    )
    value(
        "--event-log-handler",
        "--event_log_handler",
        type=str,
        default="null",
        help="Where elastic events go: null, console, dynamic_rendezvous. (PET_EVENT_LOG_HANDLER)",
    )
    value(
        "--role",
        type=str,
        default="default",
        help="Worker role name: ROLE_NAME and the tee prefix. (PET_ROLE)",
    )
    flag("-m", "--module", help="Run the script argument as a module, like 'python -m'. (PET_MODULE)")
    flag(
        "--no-python",
        "--no_python",
        help="Execute the script argument directly instead of with python. (PET_NO_PYTHON)",
    )
    flag(
        "--run-path",
        "--run_path",
        help="Run the script with runpy.run_path; wins over --no-python. (PET_RUN_PATH)",
    )
    value(
        "--log-dir",
        "--log_dir",
        type=str,
        default=None,
        help="Base directory for per-run log files (a run sub-directory is created). (PET_LOG_DIR)",
    )
    value(
        "-r",
        "--redirects",
        type=str,
        default="0",
        help="Send worker streams to files: 0 none, 1 stdout, 2 stderr, 3 both, or a "
        "per-local-rank map like 0:3,1:1. (PET_REDIRECTS)",
    )
    value(
        "-t",
        "--tee",
        type=str,
        default="0",
        help="Like --redirects, but also copy to the console with a rank prefix. (PET_TEE)",
    )
    value(
        "--local-ranks-filter",
        "--local_ranks_filter",
        type=str,
        default="",
        help="Comma list of local ranks whose output is shown on the console; "
        "files are not filtered. (PET_LOCAL_RANKS_FILTER)",
    )
    value(
        "--duplicate-stdout-filters",
        "--duplicate_stdout_filters",
        type=_comma_list,
        default=[],
        help="Comma list of needles; tee'd stdout lines containing one are also written to "
        "filtered_stdout.log (',,' is a literal comma). (PET_DUPLICATE_STDOUT_FILTERS)",
    )
    value(
        "--duplicate-stderr-filters",
        "--duplicate_stderr_filters",
        type=_comma_list,
        default=[],
        help="The same for stderr and filtered_stderr.log. (PET_DUPLICATE_STDERR_FILTERS)",
    )

    # caffe2-era options, used by the static backend.
    value(
        "--node-rank",
        "--node_rank",
        type=int,
        default=0,
        help="This node's rank (static backend only). (PET_NODE_RANK)",
    )
    value(
        "--master-addr",
        "--master_addr",
        type=str,
        default="127.0.0.1",
        help="Address of node 0 (static backend only). (PET_MASTER_ADDR)",
    )
    value(
        "--master-port",
        "--master_port",
        type=int,
        default=None,
        help="Port on node 0 (static backend only; 29500 when not given). Giving it keeps "
        "the static backend even on one node. (PET_MASTER_PORT)",
    )
    value(
        "--local-addr",
        "--local_addr",
        type=str,
        default=None,
        help="This node's address for the rendezvous; otherwise the FQDN. (PET_LOCAL_ADDR)",
    )

    # No PET_* fallback for these two in torchrun either.
    parser.add_argument(
        "--logs-specs",
        "--logs_specs",
        type=str,
        default=None,
        help="Name of a torchrun.logs_specs entry point; only 'default' is supported here.",
    )
    parser.add_argument(
        "--numa-binding",
        "--numa_binding",
        type=str,
        choices=list(NUMA_BINDING_CHOICES),
        default=None,
        help="Bind each worker to CPUs near its GPU.",
    )

    value(
        "--signals-to-handle",
        "--signals_to_handle",
        type=str,
        default=_DEFAULT_SIGNALS,
        help="Comma list of signals the launcher traps and forwards to the workers. (PET_SIGNALS_TO_HANDLE)",
    )
    value(
        "--shutdown-timeout",
        "--shutdown_timeout",
        type=int,
        default=None,
        help="Seconds between a forwarded signal and SIGKILL; default "
        "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30. (PET_SHUTDOWN_TIMEOUT)",
    )
    flag(
        "--virtual-local-rank",
        "--virtual_local_rank",
        help="Give every worker LOCAL_RANK=0 and only its own GPU in CUDA_VISIBLE_DEVICES. "
        "(PET_VIRTUAL_LOCAL_RANK)",
    )

    # monarch.launch's own options (not in torchrun).
    value(
        "--kill-grace-period",
        "--kill_grace_period",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="[monarch] After a worker fails, seconds between SIGTERM and SIGKILL for the "
        "other workers (torchrun hard-codes 30). (PET_KILL_GRACE_PERIOD)",
    )
    value(
        "--hang-timeout",
        "--hang_timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="[monarch] When no worker has printed anything or exited for SECONDS, print "
        "the Python stacks of every worker (SIGUSR1 does it on demand); 0 or unset = off. "
        "(PET_HANG_TIMEOUT)",
    )
    flag(
        "--summary",
        help="[monarch] Print a per-rank summary (exit code, wall time, peak RSS) at the end. (PET_SUMMARY)",
    )
    value(
        "--preload",
        type=str,
        default=PRELOAD_AUTO,
        metavar="MODULE[,MODULE...]",
        help="[monarch] Import these modules once, in a template process the workers are "
        "forked from, instead of once per worker (e.g. torch). Their import sees only the "
        "environment all workers share. Default `auto`: torch, when the script's top-level "
        "statements before `import torch` are only imports and docstrings and the variables "
        "torch reads at import (OMP_NUM_THREADS ...) are equal in every rank; `none`: off. "
        "(PET_PRELOAD)",
    )
    value(
        "--hosts",
        type=str,
        default=None,
        metavar="SPEC",
        help="[monarch] Single-controller mode: this launcher alone starts --nproc-per-node "
        "workers on every host of SPEC, through their host agents (`python -m monarch.host`). "
        "SPEC is what hosts_from_config accepts: local:N (N agents on this machine), agent "
        "addresses (tcp:HOST:PORT,... with MONARCH_HOST_SECRET or MONARCH_HOST_SECRET_FILE "
        "set), or a file naming them. Host i is GROUP_RANK i; no other launcher is needed. "
        "(PET_HOSTS)",
    )

    parser.add_argument(
        "training_script",
        type=str,
        help="The script (or module with -m, or executable with --no-python), followed by its own arguments.",
    )
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


# ---------------------------------------------------------------------------
# resource detection without torch
# ---------------------------------------------------------------------------


def cpu_count() -> int:
    """CPUs this process may run on: what ``torch._utils.cpu_count()`` returns."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _physical_cuda_devices() -> list[str | None]:
    """One entry per NVIDIA GPU the driver exposes (its UUID when known).

    ``/proc/driver/nvidia/gpus`` is cheap and needs no binary; ``nvidia-smi -L``
    is the fallback (containers often lack the proc entry) and also yields
    UUIDs for matching ``CUDA_VISIBLE_DEVICES=GPU-...``.
    """
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15, check=False)
        except (OSError, subprocess.SubprocessError):
            out = None
        if out is not None and out.returncode == 0:
            uuids = re.findall(r"^GPU \d+:.*\(UUID: (GPU-[^)]+)\)", out.stdout, re.MULTILINE)
            if uuids:
                return list(uuids)
    try:
        entries = os.listdir("/proc/driver/nvidia/gpus")
    except OSError:
        return []
    return [None] * len(entries)


def cuda_device_count(environ: Mapping[str, str] | None = None) -> int:
    """Number of CUDA devices a worker would see, found without importing torch.

    Applies ``CUDA_VISIBLE_DEVICES`` with the CUDA runtime's rule: entries are
    read in order and the first invalid one (negative, out of range,
    duplicate, unknown UUID) ends the list, so ``""`` and ``"-1"`` mean none.

    A CPU-only torch build on a GPU machine would report 0 where we report the
    GPUs; we cannot know which torch the workers will import.
    """
    env = os.environ if environ is None else environ
    physical = _physical_cuda_devices()
    if not physical:
        return 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return len(physical)
    seen: set[str] = set()
    count = 0
    for raw in visible.split(","):
        item = raw.strip()
        key: str
        if re.fullmatch(r"[+-]?\d+", item):
            index = int(item)
            if index < 0 or index >= len(physical):
                break
            key = str(index)
        elif item.startswith(("GPU-", "MIG-")):
            known = [u for u in physical if u is not None]
            if known and item.startswith("GPU-"):
                matches = [u for u in known if u.startswith(item)]
                if len(matches) != 1:
                    break
                key = matches[0]
            else:
                key = item
        else:
            break
        if key in seen:
            break
        seen.add(key)
        count += 1
    return count


def resolve_nproc_per_node(value: str, environ: Mapping[str, str] | None = None) -> int:
    """Turn ``--nproc-per-node`` into a worker count, as torchrun does.

    An integer is taken as is (torchrun uses ``int()``, so ``" 3"`` and
    ``"1_0"`` work, and 0 or negatives are only rejected later). ``cpu`` is the
    CPU count, ``gpu`` the CUDA device count (error without CUDA), ``auto`` the
    CUDA count when there is one, else the CPU count.

    :raises LaunchConfigError: unknown keyword, or no such device.
    """
    try:
        return int(value)
    except ValueError:
        pass
    if value == "cpu":
        return cpu_count()
    if value == "gpu":
        count = cuda_device_count(environ)
        if count <= 0:
            raise LaunchConfigError(
                "Cuda is not available.",
                hint="no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES or driver); "
                "pass an integer or --nproc-per-node=cpu",
            )
        return count
    if value == "xpu":
        raise LaunchConfigError(
            "Xpu is not available.",
            hint="monarch.launch cannot count XPUs without torch; pass the number of workers",
        )
    if value == "privateuseone":
        raise LaunchConfigError(
            "Try to call torch.privateuseone.is_available. The backend must register a custom "
            "backend module with `torch._register_device_module('privateuseone', BackendModule)`.",
            torchrun_error="RuntimeError",
            hint="pass the number of workers as an integer",
        )
    if value == "auto":
        count = cuda_device_count(environ)
        return count if count > 0 else cpu_count()
    raise LaunchConfigError(
        f"Unsupported nproc_per_node value: {value}",
        hint="use an integer, or one of cpu, gpu, auto",
    )


# ---------------------------------------------------------------------------
# semantic validation
# ---------------------------------------------------------------------------


def _parse_nnodes(nnodes: str) -> tuple[int, int]:
    parts = nnodes.split(":")
    try:
        if len(parts) == 1:
            return int(parts[0]), int(parts[0])
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    except ValueError as exc:
        raise LaunchConfigError(str(exc), hint="--nnodes takes N or MIN:MAX") from None
    raise LaunchConfigError(
        f'nnodes={nnodes} is not in "MIN:MAX" format',
        torchrun_error="RuntimeError",
        hint="--nnodes takes N or MIN:MAX",
    )


def parse_rendezvous_endpoint(endpoint: str | None, default_port: int) -> tuple[str, int]:
    """Split ``host[:port]`` / ``[ipv6]:port`` the way torchrun does.

    :raises LaunchConfigError: bad port or host; messages are torchrun's.
    """
    if endpoint is not None:
        endpoint = endpoint.strip()
    if not endpoint:
        return ("localhost", default_port)
    rest: list[str]
    if endpoint[0] == "[" and endpoint[-1] == "]":
        host, rest = endpoint, []
    else:
        host, *rest = endpoint.rsplit(":", 1)
    if len(host) > 1 and host[0] == "[" and host[-1] == "]":
        host = host[1:-1]
    if len(rest) == 1:
        port_str = rest[0]
        port = int(port_str) if port_str and re.match(r"^[0-9]{1,5}$", port_str) else None
        if port is None or port >= 2**16:
            raise LaunchConfigError(
                f"The port number of the rendezvous endpoint '{endpoint}' must be an integer "
                "between 0 and 65536."
            )
    else:
        port = default_port
    if not re.match(r"^[\w\.:-]+$", host):
        raise LaunchConfigError(
            f"The hostname of the rendezvous endpoint '{endpoint}' must be a dot-separated list "
            "of labels, an IPv4 address, or an IPv6 address."
        )
    return host, port


def _parse_rdzv_conf(text: str) -> dict[str, str | int]:
    config: dict[str, str | int] = {}
    text = text.strip()
    if not text:
        return config
    for pair in text.split(","):
        key, *values = pair.split("=", 1)
        key = key.strip()
        if not key:
            raise LaunchConfigError(
                "The rendezvous configuration string must be in format <key1>=<value1>,...,<keyN>=<valueN>."
            )
        item = values[0].strip() if values else None
        if not item:
            raise LaunchConfigError(
                f"The rendezvous configuration option '{key}' must have a value specified."
            )
        config[key] = item
    return config


def _rdzv_int(configs: Mapping[str, str | int], key: str, default: int) -> int:
    value = configs.get(key, default)
    try:
        return int(value)
    except ValueError:
        raise LaunchConfigError(
            f"The rendezvous configuration option '{key}' does not represent a valid integer value."
        ) from None


def _entry_point_names(group: str) -> set[str]:
    from importlib import metadata  # slow to import, and needed only for unusual flag values

    try:
        return {ep.name for ep in metadata.entry_points(group=group)}
    except Exception:  # a broken distribution must not break the launcher
        return set()


def _check_backend(
    backend: str,
    endpoint: str,
    configs: Mapping[str, str | int],
    default_port: int,
) -> tuple[str, int]:
    """Validate what torchrun's rendezvous handler would validate on creation.

    Returns the parsed (host, port) of the endpoint. The network parts (binding
    or connecting the store) are left to the runtime.
    """
    if backend == "static":
        host, port = parse_rendezvous_endpoint(endpoint, -1)
        timeout = configs.get("timeout", _DEFAULT_RDZV_TIMEOUT)
        try:
            int(timeout)
        except ValueError as exc:
            raise LaunchConfigError(str(exc), hint="--rdzv-conf timeout= takes seconds") from None
        return host, port
    if backend == "c10d":
        store_type = str(configs.get("store_type", "tcp")).strip().lower()
        if store_type not in ("tcp", "file"):
            raise LaunchConfigError("Invalid store type given. Currently only supports file and tcp.")
        if store_type == "tcp":
            host, port = parse_rendezvous_endpoint(endpoint, default_port)
            if "is_host" in configs:
                parse_rdzv_bool("is_host", configs["is_host"])
            if _rdzv_int(configs, "read_timeout", 60) <= 0:
                raise LaunchConfigError("The read timeout must be a positive integer.")
        else:
            host, port = endpoint, -1
        # torchrun converts all four before checking any of them.
        timeouts = {
            name: _rdzv_int(configs, f"{name}_timeout", 1)
            for name in ("join", "last_call", "close", "heartbeat")
        }
        for name, seconds in timeouts.items():
            if seconds <= 0:
                raise LaunchConfigError(f"The {name} timeout ({_timedelta_str(seconds)}) must be positive.")
        _rdzv_int(configs, "keep_alive_interval", 5)
        _rdzv_int(configs, "keep_alive_max_attempt", 3)
        return host, port
    if backend in ("etcd", "etcd-v2"):
        raise LaunchConfigError(
            f"The rendezvous backend '{backend}' is not supported by monarch.launch.",
            torchrun_error=None,
            hint="use --rdzv-backend=c10d (or static with --master-addr/--master-port)",
        )
    if backend in _entry_point_names("torchrun.handlers"):
        raise LaunchConfigError(
            f"The rendezvous backend '{backend}' is a torchrun plugin, which monarch.launch cannot load.",
            torchrun_error=None,
            hint="use --rdzv-backend=c10d or static",
        )
    raise LaunchConfigError(
        f"The rendezvous backend '{backend}' is not registered. Did you forget to call `register`?",
        hint="known backends: static, c10d",
    )


def _can_trap(name: str) -> bool:
    """Whether ``signal.signal(getattr(signal, name), ...)`` would succeed."""
    sig = getattr(signal, name, None)
    return isinstance(sig, signal.Signals) and sig not in (signal.SIGKILL, signal.SIGSTOP)


def _timedelta_str(seconds: int) -> str:
    """``str(timedelta(seconds=n))`` without importing datetime for one message."""
    import datetime

    return str(datetime.timedelta(seconds=seconds))


def config_from_namespace(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Validate a parsed namespace and build the :class:`LaunchConfig`.

    Checks run in torchrun's order (``run()``, ``config_from_args()``,
    ``launch_agent()``, the rendezvous handler, ``WorkerSpec``) so that a
    command line with several mistakes reports the same first one.

    :param environ: the launcher's environment (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``,
        ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``, ``CUDA_VISIBLE_DEVICES``);
        ``None`` means ``os.environ``.
    :raises LaunchConfigError: the first bad value.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    notices: list[str] = []

    # torchrun.run(): --standalone, or the silent single-node switch.
    backend: str = args.rdzv_backend
    endpoint: str = args.rdzv_endpoint
    run_id: str = args.rdzv_id
    auto_standalone = False
    if args.standalone:
        backend, endpoint, run_id = "c10d", "localhost:0", str(uuid.uuid4())
    elif backend == "static" and not endpoint and args.master_port is None:
        if _parse_nnodes(args.nnodes)[1] == 1:
            backend, endpoint = "c10d", "localhost:0"
            if args.hosts is None:  # --hosts is a job of several nodes: its id stays, as theirs does
                run_id = str(uuid.uuid4())
            auto_standalone = True
    master_port: int = _STATIC_DEFAULT_PORT if args.master_port is None else args.master_port

    # config_from_args()
    min_nodes, max_nodes = _parse_nnodes(args.nnodes)
    if not 0 < min_nodes <= max_nodes:
        raise LaunchConfigError(
            f"min_nodes must be > 0 and <= max_nodes, got min_nodes={min_nodes}, max_nodes={max_nodes}",
            torchrun_error="AssertionError",
        )
    if args.max_restarts < 0:
        raise LaunchConfigError("max_restarts must be >= 0", torchrun_error="AssertionError")
    if backend != "static" and not endpoint:
        notices.append(
            "master_addr is only used for static rdzv_backend and when rdzv_endpoint is not specified."
        )
    if args.node_rank != 0 and backend != "static":
        notices.append(
            f"node_rank is only used for static rdzv_backend. It will be ignored for rdzv_backend={backend}."
        )
    nproc = resolve_nproc_per_node(args.nproc_per_node, env)
    rdzv_configs = _parse_rdzv_conf(args.rdzv_conf)
    if backend == "static":
        rdzv_configs["rank"] = args.node_rank
    if backend == "static" and not endpoint:
        endpoint = f"{args.master_addr}:{master_port}"

    ranks_filter: frozenset[int] | None = None
    if args.local_ranks_filter:
        try:
            ranks_filter = frozenset(int(r) for r in args.local_ranks_filter.split(","))
        except ValueError:
            raise LaunchConfigError(
                "--local_ranks_filter must be a comma-separated list of integers e.g. "
                "--local_ranks_filter=0,1,2"
            ) from None

    if args.logs_specs is not None and args.logs_specs != "default":
        if args.logs_specs in _entry_point_names("torchrun.logs_specs"):
            raise LaunchConfigError(
                f"--logs-specs={args.logs_specs} names a torchrun LogsSpecs plugin, which "
                "monarch.launch cannot use.",
                torchrun_error=None,
                hint="drop --logs-specs; use --log-dir, -r and -t",
            )
        raise LaunchConfigError(
            f"Could not find entrypoint under 'torchrun.logs_specs[{args.logs_specs}]' key"
        )

    redirects = parse_std(args.redirects)
    tee = parse_std(args.tee)
    log_dir: str | None = args.log_dir or None
    if log_dir is not None and log_dir != os.devnull and os.path.isfile(log_dir):
        raise LaunchConfigError(
            f"log_dir: {log_dir} is a file",
            torchrun_error="NotADirectoryError",
            hint="--log-dir must be a directory (it is created if missing)",
        )

    if "timeout" not in rdzv_configs:
        rdzv_configs["timeout"] = _DEFAULT_RDZV_TIMEOUT
    shutdown_timeout: int
    if args.shutdown_timeout is None:
        raw = env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
        try:
            shutdown_timeout = int(raw)
        except ValueError as exc:
            raise LaunchConfigError(
                str(exc), hint="TORCH_ELASTIC_SHUTDOWN_TIMEOUT must be whole seconds"
            ) from None
    elif args.shutdown_timeout < 0:
        raise LaunchConfigError(f"shutdown_timeout must be non-negative, got {args.shutdown_timeout}")
    else:
        shutdown_timeout = args.shutdown_timeout

    if not args.run_path and args.no_python and args.module:
        raise LaunchConfigError(
            "Don't use both the '--no-python' flag and the '--module' flag at the same time."
        )

    # launch_agent()
    if not run_id:
        run_id = str(uuid.uuid4().int)
        notices.append(f"config has no run_id, generated a random run_id: {run_id}")
    if not backend:
        raise LaunchConfigError("The rendezvous backend name must be a non-empty string.")
    if backend == "static":
        if not endpoint.strip():
            raise LaunchConfigError(
                "Endpoint is missing in endpoint. Try to add --master-addr and --master-port"
            )
        _, port = parse_rendezvous_endpoint(endpoint, -1)
        if port == -1:
            raise LaunchConfigError(
                f"port is missing in endpoint: {endpoint.strip()}. Try to specify --master-port"
            )
    for name in args.signals_to_handle.split(","):
        if not _can_trap(name.strip()):
            notices.append(f"Failed to register signal handler for {name}")
    rdzv_host, rdzv_port = _check_backend(backend, endpoint, rdzv_configs, _C10D_DEFAULT_PORT)

    # WorkerSpec.__post_init__()
    if nproc <= 0:
        raise LaunchConfigError(
            f"nproc_per_node must be > 0, got {nproc}",
            torchrun_error="AssertionError",
        )
    if not args.monitor_interval > 0:
        raise LaunchConfigError(
            f"monitor_interval must be > 0, got {args.monitor_interval}",
            torchrun_error="AssertionError",
        )
    if not args.run_path and args.no_python and not args.training_script:
        raise LaunchConfigError("the executable to run is empty", torchrun_error="AssertionError")

    # Our own flags.
    kill_grace = float(args.kill_grace_period)
    if not kill_grace >= 0:
        raise LaunchConfigError(
            f"--kill-grace-period must be >= 0 seconds, got {args.kill_grace_period}",
            torchrun_error=None,
        )
    hang_timeout: float | None = args.hang_timeout
    if hang_timeout is not None:
        if not hang_timeout >= 0:
            raise LaunchConfigError(
                f"--hang-timeout must be >= 0 seconds, got {args.hang_timeout}",
                torchrun_error=None,
                hint="0 (or leaving it out) disables the hang detector",
            )
        if hang_timeout == 0:
            hang_timeout = None

    preload_auto = args.preload.strip() == PRELOAD_AUTO
    preload: tuple[str, ...] = ()
    if args.preload.strip() not in (PRELOAD_AUTO, PRELOAD_NONE):
        preload = tuple(m.strip() for m in args.preload.split(",") if m.strip())
    bad = [m for m in preload if not all(part.isidentifier() for part in m.split("."))]
    if bad:
        raise LaunchConfigError(
            f"--preload takes module names, got {', '.join(repr(m) for m in bad)}",
            torchrun_error=None,
            hint="for example --preload torch,numpy",
        )
    if preload and args.no_python:
        raise LaunchConfigError(
            "--preload imports Python modules for Python workers; with --no-python the workers "
            "are not Python",
            torchrun_error=None,
            hint="drop --preload, or --no-python",
        )

    hosts = _hosts_spec(args.hosts, min_nodes, max_nodes)

    return LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        nproc_per_node_arg=args.nproc_per_node,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_id=run_id,
        rdzv_configs=rdzv_configs,
        rdzv_host=rdzv_host,
        rdzv_port=rdzv_port,
        standalone=bool(args.standalone),
        auto_standalone=auto_standalone,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=master_port,
        local_addr=args.local_addr,
        max_restarts=args.max_restarts,
        monitor_interval=float(args.monitor_interval),
        start_method=args.start_method,
        shutdown_timeout=shutdown_timeout,
        signals_to_handle=args.signals_to_handle,
        event_log_handler=args.event_log_handler,
        role=args.role,
        module=bool(args.module),
        no_python=bool(args.no_python),
        run_path=bool(args.run_path),
        training_script=args.training_script,
        training_script_args=tuple(args.training_script_args),
        log_dir=log_dir,
        redirects=std_to_map(redirects, nproc),
        tee=std_to_map(tee, nproc),
        local_ranks_filter=ranks_filter,
        duplicate_stdout_filters=tuple(args.duplicate_stdout_filters),
        duplicate_stderr_filters=tuple(args.duplicate_stderr_filters),
        log_line_prefix_template=env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        logs_specs=args.logs_specs,
        numa_binding=args.numa_binding,
        virtual_local_rank=bool(args.virtual_local_rank),
        kill_grace_period=kill_grace,
        hang_timeout=hang_timeout,
        summary=bool(args.summary),
        preload=preload,
        preload_auto=preload_auto and not args.no_python,
        hosts=hosts,
        notices=tuple(notices),
    )


def _hosts_spec(value: str | None, min_nodes: int, max_nodes: int) -> str | None:
    """``--hosts``: checked here only for what needs no host (the agents are reached later)."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise LaunchConfigError(
            "--hosts is empty",
            torchrun_error=None,
            hint="--hosts local:2, --hosts tcp:10.0.0.5:4100,tcp:10.0.0.6:4100, or a file naming the agents",
        )
    if max_nodes != 1:
        raise LaunchConfigError(
            f"--hosts and --nnodes={min_nodes}:{max_nodes} do not go together: with --hosts one "
            "launcher runs every node, and the hosts decide how many nodes there are",
            torchrun_error=None,
            hint="drop --nnodes (one launcher with --hosts), or drop --hosts (one launcher per node)",
        )
    return value


def parse_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """Parse a torchrun-style command line into a validated :class:`LaunchConfig`.

    :param argv: the arguments after the program name; ``None`` = ``sys.argv[1:]``.
    :param environ: source of ``PET_*`` and the other variables torchrun reads;
        ``None`` = ``os.environ``. Nothing is written to it (torchrun sets
        ``OMP_NUM_THREADS`` here; we leave that to the worker environment).
    :raises SystemExit: with code 2 for argument syntax errors (argparse).
    :raises LaunchConfigError: for bad values torchrun rejects after parsing.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    env: Mapping[str, str] = os.environ if environ is None else environ
    namespace = build_parser(env).parse_args(args)
    notice = None
    if "SLURM_JOB_ID" in env or "SLURM_JOBID" in env:
        from .slurm_env import apply_slurm_defaults

        notice = apply_slurm_defaults(namespace, given_options(args, env), env)
    config = config_from_namespace(namespace, env)
    return config if notice is None else dataclasses.replace(config, notices=(notice, *config.notices))


def given_options(argv: Sequence[str], environ: Mapping[str, str]) -> set[str]:
    """The dests that ``argv`` or a ``PET_*`` variable of ``environ`` sets (the others keep
    their defaults): a second parse of an already valid command line, with no defaults."""
    parser = build_parser({})
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    given = set(vars(parser.parse_args(list(argv))))
    return given | {a.dest for a in parser._actions if f"PET_{a.dest.upper()}" in environ}


def parse_args_or_exit(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> LaunchConfig:
    """:func:`parse_args` for the entry point: config errors print and exit 1.

    torchrun shows a Python traceback and exits 1 for these; the exit code is
    what scripts test, and a one-line message with a hint is kinder than a
    traceback, so we keep the code and drop the traceback.
    """
    try:
        return parse_args(argv, environ)
    except LaunchConfigError as err:
        _die(err)


def _die(err: LaunchConfigError) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {err.format()}\n")
    sys.stderr.flush()
    raise SystemExit(1)
