"""Log files and console output of a launch.

* :func:`launcher_logger`: the launcher's own messages, in torchrun's glog-like format
  (``W1202 09:54:38.728000 12735 monarch/_src/launch/agent.py:123] ...``), at the level
  named by ``LOGLEVEL`` (default WARNING), on stderr.
* :class:`RunDirs`: torchrun's directory layout,
  ``<log_dir>/<run_id>_<rand8>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}``.
  Without ``--log-dir`` the same tree lives in a private temporary directory that is
  removed when the run ends (torchrun leaks one ``$TMPDIR/torchelastic_*`` per run).
* :class:`Tailer`: copies what workers write to their files onto the launcher's console,
  each line prefixed ``[<role><local_rank>]:`` (or ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``)
  for ``-t``/``--tee``, and tells the hang detector when a rank last wrote anything. Like
  torchrun's tee it reads the files, so nothing a worker wrote is lost when it dies.
"""

from __future__ import annotations

import logging
import os
import shutil
import string
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from monarch._src.runtime import output_writer

__all__ = ["RunDirs", "TailFile", "Tailer", "launcher_logger", "line_prefix"]

_LEVEL_CHARS = {
    logging.DEBUG: "D",
    logging.INFO: "I",
    logging.WARNING: "W",
    logging.ERROR: "E",
    logging.CRITICAL: "C",
}
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class _GlogFormatter(logging.Formatter):
    """``<L><MMDD> <HH:MM:SS.micro> <pid> <path>:<line>] <msg>``, one prefix per line."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        path = record.pathname
        if path.startswith(_PACKAGE_ROOT + os.sep):
            path = path[len(_PACKAGE_ROOT) + 1 :]
        prefix = (
            f"{_LEVEL_CHARS.get(record.levelno, 'I')}{time.strftime('%m%d %H:%M:%S', when)}.{micros:06d} "
            f"{record.process} {path}:{record.lineno}] "
        )
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return "\n".join(prefix + line for line in text.split("\n"))


def launcher_logger() -> logging.Logger:
    """The ``monarch.launch`` logger, set up once for the command line."""
    log = logging.getLogger("monarch.launch")
    if not getattr(log, "_monarch_launch_configured", False):
        level_name = os.environ.get("LOGLEVEL", "WARNING").upper()
        level = logging.getLevelName(level_name)
        log.setLevel(level if isinstance(level, int) else logging.WARNING)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_GlogFormatter())
        log.addHandler(handler)
        log.propagate = False
        log._monarch_launch_configured = True  # type: ignore[attr-defined]
    return log


def line_prefix(template: str | None, role: str, rank: int, local_rank: int) -> str:
    """The tee prefix: ``[<role><local_rank>]:`` or the user's template."""
    if template:
        return string.Template(template).safe_substitute(role_name=role, rank=rank, local_rank=local_rank)
    return f"[{role}{local_rank}]:"


class RunDirs:
    """The log tree of one run (one ``<run_id>_<rand8>`` directory).

    :param log_dir: ``--log-dir``; ``None`` = a private temporary base removed by
        :meth:`cleanup`; ``os.devnull`` = no files at all.
    """

    def __init__(self, log_dir: str | None, run_id: str) -> None:
        self.disabled = log_dir == os.devnull
        self.private = log_dir is None
        self._private_base: str | None = None
        self.run_dir = ""
        if self.disabled:
            return
        if log_dir is None:
            self._private_base = tempfile.mkdtemp(prefix="monarch_launch_")
            base = self._private_base
        else:
            base = log_dir
            os.makedirs(base, exist_ok=True)
        self.run_dir = tempfile.mkdtemp(prefix=f"{run_id}_", dir=base)

    def attempt_dir(self, attempt: int, nproc: int) -> str:
        """Create (afresh) ``attempt_<n>/`` with one directory per local rank."""
        if self.disabled:
            return os.devnull
        path = os.path.join(self.run_dir, f"attempt_{attempt}")
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        for local_rank in range(nproc):
            os.mkdir(os.path.join(path, str(local_rank)))
        return path

    def scratch(self) -> str:
        """A private directory for the launcher's own files (deleted by :meth:`cleanup`)."""
        if self._private_base is None:
            self._private_base = tempfile.mkdtemp(prefix="monarch_launch_")
        path = os.path.join(self._private_base, ".monarch")
        os.makedirs(path, exist_ok=True)
        return path

    def cleanup(self) -> None:
        if self._private_base is not None:
            shutil.rmtree(self._private_base, ignore_errors=True)
            self._private_base = None


@dataclass
class TailFile:
    """One worker stream read from its file.

    :param prefix: put in front of every line copied to the console; ``None`` = copy
        nothing to the console (file only, still counted as activity).
    :param console: ``"stdout"`` or ``"stderr"``: where copied lines go.
    :param duplicate_to: also write lines containing one of ``needles`` (prefixed) there.
    """

    path: str
    rank: int
    prefix: str | None
    console: str = "stdout"
    duplicate_to: str | None = None
    needles: tuple[str, ...] = ()
    offset: int = 0
    partial: bytes = b""
    partial_since: float = 0.0
    finished: bool = field(default=False)


class Tailer:
    """A daemon thread polling worker files every ``interval`` seconds.

    ``last_activity`` is the monotonic time a tracked file last grew (hang detection).
    A line without its newline yet is held back up to ``PARTIAL_HOLD_S``, then shown.
    """

    PARTIAL_HOLD_S = 0.5

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.last_activity = time.monotonic()
        self._files: list[TailFile] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._dup_handles: dict[str, object] = {}
        self._thread: threading.Thread | None = None
        self.on_activity: Callable[[int], None] | None = None

    def add(self, tail: TailFile) -> None:
        with self._lock:
            self._files.append(tail)
        if tail.duplicate_to and tail.duplicate_to not in self._dup_handles:
            self._dup_handles[tail.duplicate_to] = open(tail.duplicate_to, "ab")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="monarch-launch-tail", daemon=True)
            self._thread.start()

    def finish_rank(self, rank: int) -> None:
        """The rank's process ended: read its files to the end now."""
        with self._lock:
            tails = [t for t in self._files if t.rank == rank and not t.finished]
            for t in tails:
                self._poll_one(t, final=True)
                t.finished = True

    def reset(self) -> None:
        """Drain and forget every file (the end of an attempt)."""
        with self._lock:
            for t in self._files:
                if not t.finished:
                    self._poll_one(t, final=True)
                    t.finished = True
            self._files = []
            handles, self._dup_handles = self._dup_handles, {}
        for h in handles.values():
            try:
                h.close()  # type: ignore[attr-defined]
            except OSError:
                pass

    def stop(self) -> None:
        self.reset()
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                for t in self._files:
                    if not t.finished:
                        self._poll_one(t, final=False)

    def _poll_one(self, t: TailFile, final: bool) -> None:
        try:
            size = os.path.getsize(t.path)
        except OSError:
            return
        now = time.monotonic()
        if size < t.offset:
            t.offset = 0  # truncated (a fresh open with O_TRUNC): start over
        if size > t.offset:
            try:
                with open(t.path, "rb") as fp:
                    fp.seek(t.offset)
                    data = fp.read(size - t.offset)
            except OSError:
                return
            t.offset += len(data)
            self.last_activity = now
            if self.on_activity is not None:
                self.on_activity(t.rank)
            if not t.partial:
                t.partial_since = now
            self._emit(t, t.partial + data, final)
        elif t.partial and (final or now - t.partial_since >= self.PARTIAL_HOLD_S):
            self._emit(t, t.partial, True)

    def _emit(self, t: TailFile, data: bytes, final: bool) -> None:
        cut = data.rfind(b"\n") + 1
        lines, rest = data[:cut], data[cut:]
        if rest and final:
            lines, rest = data, b""
        t.partial = rest
        if not lines:
            return
        chunks = lines.splitlines(keepends=True)
        if t.prefix is not None:
            text = "".join(t.prefix + c.decode("utf-8", "replace") for c in chunks)
            if not text.endswith("\n"):
                text += "\n"
            output_writer.writer(t.console).write(text, force=True)
        if t.duplicate_to and t.needles:
            handle = self._dup_handles.get(t.duplicate_to)
            if handle is not None:
                prefix = (t.prefix or "").encode()
                picked = [prefix + c for c in chunks if any(n.encode() in c for n in t.needles)]
                if picked:
                    try:
                        handle.write(b"".join(picked))  # type: ignore[attr-defined]
                        handle.flush()  # type: ignore[attr-defined]
                    except OSError:
                        pass
