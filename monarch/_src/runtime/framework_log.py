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


def _base_dir() -> str:
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except Exception:
        user = str(os.getuid())
    for root in ("/tmp", tempfile.gettempdir()):
        path = os.path.join(root, user)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            return os.path.join(path, "monarch-logs")
    return os.path.join(tempfile.gettempdir(), f"monarch-logs-{os.getuid()}")


def log_dir() -> str:
    """This job's log directory (the client picks it; workers inherit it through the env)."""
    global _log_dir
    with _lock:
        if _log_dir is None:
            inherited = os.environ.get(LOG_DIR_ENV)
            if inherited:
                _log_dir = inherited
            else:
                stamp = time.strftime("%Y%m%d-%H%M%S")
                _log_dir = os.path.join(_base_dir(), f"job-{stamp}-{os.getpid()}")
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
    if file_level < OFF:
        path = os.path.join(log_dir(), file_name)
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
    global _configured, _log_dir, _log_file
    with _lock:
        _configured = False
        _log_dir = None
        _log_file = None
