"""Helpers shared by test modules (importable as ``helpers``: pytest puts ``tests/`` on the path
for its conftest)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

T = TypeVar("T")

TESTS = Path(__file__).resolve().parent
#: First line of a client script run with ``python -c``: puts this folder's modules (``actors``)
#: on the import path of the script and of its workers (they get the client's import path).
IMPORT_TEST_MODULES = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"


def wait_until(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy, and return that; fail the test at the
    deadline. For conditions observable only from outside (files, /proc), not for runtime
    events, which tests wait for through futures."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def alive(procs: Iterable[psutil.Process | int]) -> list[psutil.Process]:
    """Those of ``procs`` (processes or pids) still running; a zombie counts as gone: only its
    reaping is left."""
    out = []
    for p in procs:
        try:
            proc = p if isinstance(p, psutil.Process) else psutil.Process(p)
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            pass
    return out


def running(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still running."""
    return [p.pid for p in alive(pids)]


def wait_while(find: Callable[[], list[T]], timeout: float = 10.0) -> list[T]:
    """Poll ``find`` (the processes still up) until it finds nothing or ``timeout`` passes; return
    its last answer. The one poller behind every "these processes must end" check: the leak
    checks of both conftests and ``wait_gone``."""
    deadline = time.monotonic() + timeout
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` runs; returns those still running at the deadline."""
    return wait_while(lambda: running(pids), timeout)


def kill_leftovers(procs: list[psutil.Process]) -> None:
    """SIGKILL what a leak check found, so one leaking test does not fail the next ones too."""
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
