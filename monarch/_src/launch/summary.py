"""What the launcher reports at the end: torchrun's failure summary and our per-rank table.

The failure summary keeps the exact layout of torchrun's ``ChildFailedError`` message
(the thing people paste into issues and grep in CI logs): a title ``<script> FAILED``,
the other failures, then the root cause, each as a block with time, host, rank, exit code
(and signal), error file and traceback. The traceback comes from the error file that
torch's ``@record`` writes (``TORCHELASTIC_ERROR_FILE``); without one it is torchrun's
pointer to the docs, or the signal that killed the worker.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChildFailedError",
    "ProcessFailure",
    "RankReport",
    "format_rank_summary",
    "signal_name",
]

NOT_AVAILABLE = "<N/A>"
TRACEBACK_HINT = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"


def signal_name(exitcode: int) -> str:
    """``"SIGTERM"`` for -15; ``<N/A>`` for exit codes that are not deaths by signal."""
    if exitcode >= 0:
        return NOT_AVAILABLE
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return NOT_AVAILABLE


@dataclass
class ProcessFailure:
    """One failed worker, as torchrun reports it.

    :param local_rank: the worker's local rank.
    :param rank: its global rank.
    :param pid: its process id.
    :param exitcode: its exit status (``-N`` for death by signal N); 1 for a function
        that raised (library mode).
    :param error_file: the ``TORCHELASTIC_ERROR_FILE`` it was given.
    :param message: overrides the traceback line (library mode: the remote traceback).
    :param detected: when the launcher saw it (epoch seconds), used when the error file
        has no timestamp.
    :param host: the node it ran on; empty means this one (``socket.getfqdn()``).
    :param node: its node's group rank in a multi-node job, else ``None``.
    """

    local_rank: int
    rank: int
    pid: int
    exitcode: int
    error_file: str = ""
    message: Any = None
    detected: float = field(default_factory=time.time)
    timestamp: int = 0
    error_data: dict[str, Any] | None = None
    host: str = ""
    node: int | None = None

    def __post_init__(self) -> None:
        self.timestamp = int(self.detected)
        if self.error_file and os.path.isfile(self.error_file):
            try:
                with open(self.error_file) as fp:
                    data = json.load(fp)
                message = data["message"]
                if isinstance(message, str):
                    self.timestamp = int(data.get("timestamp", 0))
                else:
                    self.timestamp = int(message["extraInfo"]["timestamp"])
                self.message = message
                self.error_data = data
            except (OSError, ValueError, KeyError, TypeError):
                self.error_file = NOT_AVAILABLE
        else:
            self.error_file = NOT_AVAILABLE
        if not self.message:
            if self.exitcode < 0:
                self.message = f"Signal {-self.exitcode} ({self.signal_name()}) received by PID {self.pid}"
            else:
                self.message = TRACEBACK_HINT

    def signal_name(self) -> str:
        """Name of the signal that killed the worker (``SIGKILL``), or ``<N/A>`` if it exited."""
        return signal_name(self.exitcode)

    def timestamp_isoformat(self) -> str:
        """When the failure was recorded, in local time, as torchrun prints it."""
        return datetime.datetime.fromtimestamp(self.timestamp).isoformat(sep="_")

    def traceback_text(self) -> str:
        """The worker's traceback from its error file, or the reason there is none, for the summary."""
        msg = self.message
        if isinstance(msg, dict):
            inner = msg.get("extraInfo", {}).get("py_callstack", msg.get("message", NOT_AVAILABLE))
            return str(inner).replace("\n", "\n  ")
        return str(msg)


class ChildFailedError(Exception):
    """Workers failed; ``str()`` is torchrun's summary. Raised by the library form.

    :param name: the title (``<script> FAILED``): the script as typed, the module, the
        executable, ``run_script_path`` or the function's name.
    :param failures: global rank -> failure, the first observed failures first.
    """

    def __init__(self, name: str, failures: dict[int, ProcessFailure]) -> None:
        self.name = name
        self.failures = failures
        super().__init__(self.format_msg())

    def __reduce__(self) -> Any:
        return (ChildFailedError, (self.name, self.failures))

    def get_first_failure(self) -> tuple[int, ProcessFailure]:
        """The global rank that failed first and its failure: the likely root cause."""
        rank = min(self.failures, key=lambda r: self.failures[r].timestamp)
        return rank, self.failures[rank]

    def format_msg(self, border: str = "=", section: str = "-") -> str:
        """torchrun's failure summary: the first failure as root cause, then the others."""
        title = f"{self.name} FAILED"
        root_rank, _ = self.get_first_failure()
        root = ""
        others: list[str] = []
        width = len(title)
        for idx, (rank, failure) in enumerate(self.failures.items()):
            text = _format_failure(idx, rank, failure)
            width = max(width, max(len(line) for line in text.split("\n")))
            if rank == root_rank:
                root = text
            else:
                others.append(text)
        width = min(width, 60)
        return "\n".join(
            [
                "",
                border * width,
                title,
                section * width,
                "Failures:",
                "\n".join(others or ["  <NO_OTHER_FAILURES>"]),
                section * width,
                "Root Cause (first observed failure):",
                root,
                border * width,
            ]
        )


def _format_failure(idx: int, rank: int, failure: ProcessFailure) -> str:
    sig = failure.signal_name()
    sig_text = f" ({sig})" if sig != NOT_AVAILABLE else ""
    node = f" (node_rank: {failure.node})" if failure.node is not None else ""
    return (
        f"[{idx}]:\n"
        f"  time      : {failure.timestamp_isoformat()}\n"
        f"  host      : {failure.host or socket.getfqdn()}{node}\n"
        f"  rank      : {rank} (local_rank: {failure.local_rank})\n"
        f"  exitcode  : {failure.exitcode} (pid: {failure.pid}) {sig_text}\n"
        f"  error_file: {failure.error_file}\n"
        f"  traceback : {failure.traceback_text()}"
    )


@dataclass
class RankReport:
    """One line of ``--summary``."""

    rank: int
    local_rank: int
    pid: int
    exitcode: int | None
    wall_s: float
    peak_rss_kib: int | None


def _rss(kib: int | None) -> str:
    if kib is None:
        return "?"
    if kib >= 1 << 20:
        return f"{kib / (1 << 20):.2f} GiB"
    return f"{kib / 1024:.1f} MiB"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        return f"{code} ({signal_name(code)})"
    return str(code)


def format_rank_summary(reports: list[RankReport], *, attempts: int, max_restarts: int, outcome: str) -> str:
    """The ``--summary`` table: one row per rank of the last attempt."""
    header = ("rank", "local_rank", "pid", "exitcode", "wall time", "peak RSS")
    rows = [
        (
            str(r.rank),
            str(r.local_rank),
            str(r.pid),
            _exit_text(r.exitcode),
            f"{r.wall_s:.2f} s",
            _rss(r.peak_rss_kib),
        )
        for r in sorted(reports, key=lambda r: r.rank)
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [
        f"monarch.launch summary: {outcome}; {attempts} attempt{'s' if attempts != 1 else ''} "
        f"(--max-restarts={max_restarts})"
    ]
    for row in (header, *rows):
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return "\n".join(lines)
