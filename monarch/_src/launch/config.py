"""The validated configuration of one ``python -m monarch.launch`` run.

:class:`LaunchConfig` is what the command-line front end (:mod:`.cli`) hands to
the launcher runtime. Every value in it has already been checked the way torch
2.13's ``torchrun`` checks it, so the runtime never has to re-validate user
input and never has to know about ``PET_*`` variables, flag aliases or the
rendezvous quirks of torchrun (for example the silent switch from the static
backend to an ephemeral c10d one on a single node).

The module deliberately imports nothing heavy (no torch): the launcher process
must start in milliseconds, and torchrun's two seconds of ``import torch`` are
the overhead we are removing.

Exceptions::

    ValueError
     └── LaunchConfigError   a bad value that torchrun would reject after
                             argument parsing (torchrun: traceback + exit 1)

Argument *syntax* errors are not here: argparse reports them and exits with 2,
exactly like torchrun.
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "LaunchConfig",
    "LaunchConfigError",
    "Std",
    "parse_std",
    "std_to_map",
]


class LaunchConfigError(ValueError):
    """A launch setting that parses but cannot be used.

    torchrun raises plain ``ValueError``/``AssertionError``/``RuntimeError``
    (and once ``NotADirectoryError``) for these and dies with a traceback and
    exit code 1. We raise one type instead so that the entry point can print
    a short message (plus a hint) and exit 1, while keeping torchrun's message
    text in ``str(err)`` so that people searching for it find the same words.

    It subclasses :class:`ValueError` because every case is a bad value, and
    so that ``except ValueError`` written against torchrun keeps working.

    :param message: the message, worded like torchrun's where torchrun has one.
    :param torchrun_error: the name of the exception class torchrun raises for
        the same input (``"ValueError"``, ``"AssertionError"``, ...), or
        ``None`` for checks that only monarch makes.
    :param hint: one line telling the user how to fix it.
    """

    def __init__(
        self,
        message: str,
        *,
        torchrun_error: str | None = "ValueError",
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.torchrun_error = torchrun_error
        self.hint = hint

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments are lost by the default exception pickling.
        return (_rebuild_config_error, (self.message, self.torchrun_error, self.hint))

    def format(self) -> str:
        """Render the message the entry point prints before exiting with 1."""
        kind = f"{self.torchrun_error}: " if self.torchrun_error else ""
        text = f"{kind}{self.message}"
        if self.hint:
            text += f"\nHINT: {self.hint}"
        return text


def _rebuild_config_error(message: str, torchrun_error: str | None, hint: str | None) -> LaunchConfigError:
    return LaunchConfigError(message, torchrun_error=torchrun_error, hint=hint)


class Std(enum.IntFlag):
    """Which standard streams of a worker go to a log file.

    The numeric values are the ones users type after ``-r``/``--redirects``
    and ``-t``/``--tee`` (0 none, 1 stdout, 2 stderr, 3 both), identical to
    torchrun's ``Std`` so that the two can be compared with ``int()``.
    """

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


# The same two patterns torchrun uses. They are matched with ``re.match`` like
# torchrun does, so only single-digit local ranks can be named in a map.
_STD_VALUE_RE = r"^[0123]$"
_STD_MAPPING_RE = r"^(\d:[0123],)*(\d:[0123])$"


def parse_std(value: str) -> Std | dict[int, Std]:
    """Parse a ``--redirects``/``--tee`` value: ``"3"`` or ``"0:1,1:2"``.

    :raises LaunchConfigError: the value matches neither form; the message is
        torchrun's.
    """
    if re.match(_STD_VALUE_RE, value):
        return Std(int(value.strip()))
    if re.match(_STD_MAPPING_RE, value):
        mapping: dict[int, Std] = {}
        for item in value.strip().split(","):
            rank, std = item.split(":")
            mapping[int(rank)] = Std(int(std))
        return mapping
    raise LaunchConfigError(
        f"{value} does not match: <{_STD_VALUE_RE}> or <{_STD_MAPPING_RE}>",
        hint="use 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a map such as 0:3,1:1",
    )


def std_to_map(value: Std | Mapping[int, Std], local_world_size: int) -> dict[int, Std]:
    """Expand a parsed redirect setting to one entry per local rank.

    Ranks missing from a map get :attr:`Std.NONE`; map entries for ranks at or
    above ``local_world_size`` are dropped, as torchrun drops them.
    """
    if isinstance(value, Std):
        return dict.fromkeys(range(local_world_size), value)
    return {rank: value.get(rank, Std.NONE) for rank in range(local_world_size)}


@dataclass(frozen=True)
class LaunchConfig:
    """Everything a launch needs, validated and normalised.

    Values are the *effective* ones: defaults and ``PET_*`` fallbacks applied,
    ``--standalone`` and torchrun's implicit single-node switch already turned
    into a c10d backend on ``localhost:0`` with a fresh UUID run id, and the
    ``nproc_per_node`` keywords (``cpu``, ``gpu``, ``auto``) resolved to a
    count. Mapping fields are plain dicts for cheap access; treat them as
    read-only.

    The instance is frozen so the runtime can pass it around (and pickle it
    to hosts) without anybody changing the job's shape on the way.
    """

    # -- sizes ---------------------------------------------------------------
    min_nodes: int
    """Lower bound of ``--nnodes MIN:MAX`` (``N`` means ``N:N``)."""
    max_nodes: int
    """Upper bound of ``--nnodes``; the static backend always waits for this many."""
    nproc_per_node: int
    """Workers on this node, after resolving ``cpu``/``gpu``/``auto``."""
    nproc_per_node_arg: str
    """``--nproc-per-node`` as given, kept for log lines like torchrun's."""

    # -- rendezvous ------------------------------------------------------------
    rdzv_backend: str
    """Effective backend: ``"static"`` or ``"c10d"``."""
    rdzv_endpoint: str
    """Effective endpoint; for static it is ``master_addr:master_port``."""
    rdzv_id: str
    """Run id: becomes ``TORCHELASTIC_RUN_ID`` and the log-dir prefix."""
    rdzv_configs: dict[str, str | int]
    """``--rdzv-conf`` pairs plus torchrun's injected ``timeout`` (900) and,
    for static, ``rank`` (the node rank). Values from the command line stay
    strings, exactly as in torchrun."""
    rdzv_host: str
    """Host part of the effective endpoint (brackets of IPv6 removed)."""
    rdzv_port: int
    """Port of the effective endpoint (c10d default 29400; 0 = ephemeral)."""
    standalone: bool
    """``--standalone`` was given (or ``PET_STANDALONE=1``)."""
    auto_standalone: bool
    """torchrun's silent single-node switch to c10d happened (no ``--standalone``)."""
    node_rank: int
    """``--node-rank``; meaningful for the static backend only."""
    master_addr: str
    """``--master-addr`` (static backend only)."""
    master_port: int
    """``--master-port``, or 29500 when not given (static backend only)."""
    local_addr: str | None
    """``--local-addr``: this node's address, else the FQDN is used."""

    # -- supervision -------------------------------------------------------------
    max_restarts: int
    """Worker-group restarts allowed after failures; in a multi-node job, for the whole
    job (torchrun counts them per node)."""
    monitor_interval: float
    """Seconds between polls of worker state."""
    start_method: str
    """``--start-method`` (only meaningful for ``--run-path`` in torchrun).
    Not checked against the choices when it came from ``PET_START_METHOD``,
    because torchrun does not check it either."""
    shutdown_timeout: int
    """Grace seconds between a forwarded signal and SIGKILL when the launcher
    itself is signalled (``--shutdown-timeout`` > ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` > 30)."""
    signals_to_handle: str
    """Comma list of signal names to trap and forward, verbatim (it is exported
    as ``TORCHELASTIC_SIGNALS_TO_HANDLE``)."""
    event_log_handler: str
    """``--event-log-handler`` (``null``, ``console``, ``dynamic_rendezvous``)."""
    role: str
    """Worker role: ``ROLE_NAME`` and the ``[<role><local_rank>]:`` tee prefix."""

    # -- what to run ---------------------------------------------------------------
    module: bool
    """``-m``: run ``training_script`` as a module."""
    no_python: bool
    """``--no-python``: execute ``training_script`` directly."""
    run_path: bool
    """``--run-path``: ``runpy.run_path`` the script (wins over the other two)."""
    training_script: str
    """Script path, module name or executable."""
    training_script_args: tuple[str, ...]
    """Arguments after the script, verbatim."""

    # -- logs ------------------------------------------------------------------------
    log_dir: str | None
    """``--log-dir``; ``None`` means a fresh temporary directory, ``os.devnull``
    means no files at all (and an empty ``TORCHELASTIC_ERROR_FILE``)."""
    redirects: dict[int, Std]
    """Per local rank: streams redirected to files (``-r``), as given."""
    tee: dict[int, Std]
    """Per local rank: streams written to files *and* to the console (``-t``).
    A tee'd stream is also a redirected one (torchrun ORs them)."""
    local_ranks_filter: frozenset[int] | None
    """Local ranks whose output reaches the console; ``None`` = all."""
    duplicate_stdout_filters: tuple[str, ...]
    """Needles: tee'd stdout lines containing one are copied to ``filtered_stdout.log``."""
    duplicate_stderr_filters: tuple[str, ...]
    """The same for stderr."""
    log_line_prefix_template: str | None
    """``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` from the launcher's environment."""
    logs_specs: str | None
    """``--logs-specs``; only ``None`` or ``"default"`` get this far."""
    numa_binding: str | None
    """``--numa-binding`` mode, or ``None``."""
    virtual_local_rank: bool
    """``--virtual-local-rank``: ``LOCAL_RANK=0`` and one GPU per worker."""

    # -- monarch's own flags -------------------------------------------------------------
    kill_grace_period: float = 30.0
    """Ours: seconds between SIGTERM and SIGKILL when the *other* workers are
    torn down after a failure (torchrun hard-codes 30)."""
    hang_timeout: float | None = None
    """Ours: print every rank's Python stacks when no worker has printed anything
    or exited for this many seconds; ``None`` = off (torchrun has no such thing)."""
    summary: bool = False
    """Ours: print a per-rank summary (exit code, wall time, peak RSS) at the end."""
    preload: tuple[str, ...] = ()
    """Ours: modules imported once in a template process the workers are forked from."""
    preload_auto: bool = False
    """Ours: the default ``--preload``: preload torch when the script and the ranks'
    environments make that invisible to the script (decided per run, see ``.preload``)."""
    hosts: str | None = None
    """Ours: single-controller mode. A ``hosts_from_config`` value (``local:N``, agent
    addresses, or a file naming them): this one launcher starts ``nproc_per_node`` ranks on
    every host's agent; ``None`` = the ranks run on this machine."""

    # -- diagnostics -------------------------------------------------------------------
    notices: tuple[str, ...] = field(default=())
    """Warnings torchrun would log while building its config (ignored
    ``--master-addr``/``--node-rank``, generated run id, unknown signals).
    The runtime logs them; parsing itself prints nothing."""

    @property
    def signal_names(self) -> tuple[str, ...]:
        """The entries of :attr:`signals_to_handle`, stripped, in order."""
        return tuple(name.strip() for name in self.signals_to_handle.split(","))

    def resolved_signals(self) -> tuple[signal.Signals, ...]:
        """The signals to trap; unknown names and SIGKILL/SIGSTOP are skipped,
        as torchrun skips them (with a warning, see :attr:`notices`)."""
        found: list[signal.Signals] = []
        for name in self.signal_names:
            sig = getattr(signal, name, None)
            if (
                isinstance(sig, signal.Signals)
                and sig not in (signal.SIGKILL, signal.SIGSTOP)
                and sig not in found
            ):
                found.append(sig)
        return tuple(found)

    def file_streams(self, local_rank: int) -> Std:
        """Streams of ``local_rank`` that go to a file (redirect OR tee)."""
        return self.redirects.get(local_rank, Std.NONE) | self.tee.get(local_rank, Std.NONE)

    def console_visible(self, local_rank: int) -> bool:
        """Whether ``local_rank``'s console output passes ``--local-ranks-filter``."""
        return self.local_ranks_filter is None or local_rank in self.local_ranks_filter

    @property
    def is_single_node(self) -> bool:
        """True when at most one node can take part."""
        return self.max_nodes == 1

    def rdzv_int(self, key: str, default: int | None = None) -> int | None:
        """``rdzv_configs[key]`` as an int (already validated for known keys)."""
        value = self.rdzv_configs.get(key)
        return default if value is None else int(value)

    def rdzv_bool(self, key: str, default: bool | None = None) -> bool | None:
        """``rdzv_configs[key]`` read the way torchrun reads booleans."""
        value = self.rdzv_configs.get(key)
        if value is None:
            return default
        return parse_rdzv_bool(key, value)


def parse_rdzv_bool(key: str, value: str | int | bool) -> bool:
    """torchrun's boolean reading of a ``--rdzv-conf`` value.

    :raises LaunchConfigError: not one of ``1/true/t/yes/y`` or ``0/false/f/no/n``.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value in (0, 1):
            return bool(value)
    else:
        lowered = value.lower()
        if lowered in ("1", "true", "t", "yes", "y"):
            return True
        if lowered in ("0", "false", "f", "no", "n"):
            return False
    raise LaunchConfigError(
        f"The rendezvous configuration option '{key}' does not represent a valid boolean value."
    )
