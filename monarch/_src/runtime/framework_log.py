"""Where monarch's own log records go: a file per process, and stderr only when asked.

The framework logs through the ``monarch`` logger and its children. That logger does not
propagate to the root logger, so a user's ``logging.basicConfig`` never shows framework
chatter. Its records go to

* a file per process under ``/tmp/$USER/monarch-logs/<job>/`` (``client-<pid>.log`` for the
  client, ``<mesh name>-rank<r>-<pid>.log`` for a worker), at the level named by
  ``MONARCH_FILE_LOG`` (default ``INFO``; the file is created with its first record);
* stderr at the level named by ``MONARCH_STDERR_LOG`` (default: off).

Levels are ``TRACE`` (DEBUG - 5), ``DEBUG``, ``INFO``, ``WARN`` (or ``WARNING``), ``ERROR``
and ``OFF``. ``<job>`` is chosen by the client (start time and pid) and handed to its workers
in ``MONARCH_LOG_DIR``, so one job's files sit together.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from monarch._src.runtime import log_retention

FILE_LEVEL_ENV = "MONARCH_FILE_LOG"
STDERR_LEVEL_ENV = "MONARCH_STDERR_LOG"
LOG_DIR_ENV = "MONARCH_LOG_DIR"

TRACE = logging.DEBUG - 5
OFF = logging.CRITICAL + 10
_LEVELS = {
    "TRACE": TRACE,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "OFF": OFF,
}
VALID_NAMES = "TRACE, DEBUG, INFO, WARN, ERROR, OFF"
DEFAULT_FILE_LEVEL = logging.INFO
DEFAULT_STDERR_LEVEL = OFF

FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(process)d %(threadName)s %(name)s: %(message)s"
DATEFMT = "%Y-%m-%d %H:%M:%S"

logging.addLevelName(TRACE, "TRACE")

_lock = threading.Lock()
_configured = False
_log_dir: str | None = None
_log_dir_picked = False
_log_file: str | None = None


def parse_level(variable: str, default: int, problems: list[str]) -> int:
    """The level named by environment variable ``variable``; ``default`` if unset or invalid."""
    raw = os.environ.get(variable)
    if raw is None or raw.strip() == "":
        return default
    level = _LEVELS.get(raw.strip().upper())
    if level is None:
        problems.append(
            f"{variable}={raw!r} is not a log level; valid values are "
            f"{VALID_NAMES}. Using the default, {logging.getLevelName(default) if default != OFF else 'OFF'}."
        )
        return default
    return level


def _base_dir(problems: list[str]) -> str | None:
    """The directory job log directories go in: ``/tmp/$USER/monarch-logs``, else the same
    in ``$TMPDIR``, where ``$USER`` is a directory of this user that no other user can write
    to. Its name is predictable, so another user may have made it first, or a link by that
    name, to choose where our log lines go (a link planted in it is followed when the file is
    opened) or to read them; then a fresh private directory is used, and ``problems`` says why.
    None where not even that can be made (no log files)."""
    import getpass
    import tempfile

    from monarch._src.runtime.private_dir import WRITABLE_BY_OTHERS, untrusted

    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    for root in dict.fromkeys(("/tmp", tempfile.gettempdir())):
        path = os.path.join(root, user)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            continue
        problem = untrusted(path, WRITABLE_BY_OTHERS)
        if problem is None:
            if os.access(path, os.W_OK):
                return os.path.join(path, "monarch-logs")
            continue
        problems.append(
            f"the log directory {path} {problem}: another user could choose where this job's log "
            f"lines go, or read them. Using a private directory instead.\n"
            f"HINT: remove {path} (it is recreated private)."
        )
    try:
        return tempfile.mkdtemp(prefix=f"monarch-logs-{os.getuid()}-")
    except OSError as e:
        problems.append(
            f"no private log directory could be made in {tempfile.gettempdir()} ({e}): no log files"
        )
        return None


def log_dir(problems: list[str] | None = None) -> str | None:
    """This job's log directory (the client picks it; workers inherit it through the env);
    None where there is no private place for one. Why the usual place was not used goes to
    ``problems``, or straight to stderr where None."""
    global _log_dir, _log_dir_picked
    with _lock:
        if not _log_dir_picked:
            _log_dir_picked = True
            inherited = os.environ.get(LOG_DIR_ENV)
            if inherited:
                _log_dir = inherited
            else:
                said: list[str] = []
                report = problems if problems is not None else said
                base = _base_dir(report)
                if base is not None:
                    log_retention.sweep(base, log_retention.keep_from_env(report))
                    stamp = time.strftime("%Y%m%d-%H%M%S")
                    _log_dir = os.path.join(base, f"job-{stamp}-{os.getpid()}")
                for message in said:
                    _warn_on_stderr(message)
        return _log_dir


def log_file() -> str | None:
    """The file this process's framework records go to (None before ``setup``)."""
    return _log_file


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        if self.stream is not None:
            super().emit(record)


class _LazyDirFileHandler(logging.FileHandler):
    """A FileHandler that creates its directory along with the file, at the first record."""

    def _open(self):  # type: ignore[no-untyped-def]
        os.makedirs(os.path.dirname(self.baseFilename), mode=0o700, exist_ok=True)
        return super()._open()

    def emit(self, record: logging.LogRecord) -> None:
        # Opening the file at the first record can fail (a process out of descriptors is just
        # when something worth logging happens): the record goes to stderr instead, and the
        # file is tried again at the next one. Logging must never raise into its caller.
        try:
            super().emit(record)
        except OSError:
            sys.stderr.write(self.format(record) + "\n")


def setup(file_name: str, *, is_worker: bool) -> None:
    """Configure the ``monarch`` logger once per process (later calls do nothing).

    A bad level value is reported on stderr by the client, and only in its log file by a
    worker (every worker inherits the same environment; one warning is enough).
    """
    global _configured, _log_file
    with _lock:
        if _configured:
            return
        _configured = True
    problems: list[str] = []
    file_level = parse_level(FILE_LEVEL_ENV, DEFAULT_FILE_LEVEL, problems)
    stderr_level = parse_level(STDERR_LEVEL_ENV, DEFAULT_STDERR_LEVEL, problems)
    logger = logging.getLogger("monarch")
    logger.propagate = False
    for h in list(logger.handlers):
        if getattr(h, "_monarch_framework", False):
            logger.removeHandler(h)
    formatter = logging.Formatter(FORMAT, DATEFMT)
    directory = log_dir(problems) if file_level < OFF else None
    if directory is not None:
        path = os.path.join(directory, file_name)
        handler: logging.Handler = _LazyDirFileHandler(path, delay=True, encoding="utf-8")
        handler.setLevel(file_level)
        handler.setFormatter(formatter)
        handler._monarch_framework = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        _log_file = path
    if stderr_level < OFF:
        handler = _StderrHandler()
        handler.setLevel(stderr_level)
        handler.setFormatter(formatter)
        handler._monarch_framework = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    logger.setLevel(min(file_level, stderr_level))
    for message in problems:
        if is_worker:
            logger.warning("%s", message)
        else:
            _warn_on_stderr(message)


def _warn_on_stderr(message: str) -> None:
    """A warning for the user of a client, whatever its log settings."""
    stream = sys.stderr
    if stream is not None:
        stream.write(f"monarch: warning: {message}\n")
        stream.flush()


def setup_client() -> None:
    setup(f"client-{os.getpid()}.log", is_worker=False)


def setup_worker(mesh_name: str, rank: int) -> None:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in mesh_name) or "proc"
    setup(f"{safe}-rank{rank}-{os.getpid()}.log", is_worker=True)


def _reset_for_tests() -> None:
    global _configured, _log_dir, _log_dir_picked, _log_file
    with _lock:
        _configured = False
        _log_dir = None
        _log_dir_picked = False
        _log_file = None
