"""Helpers shared by test modules (importable as ``helpers``: pytest puts ``tests/`` on the path
for its conftest)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest


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


def running(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie counts as gone: only its reaping is left)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` runs; returns those still running at the deadline."""
    deadline = time.monotonic() + timeout
    while running(pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return running(pids)


def end_client(proc: subprocess.Popen[str], pids: list[int]) -> None:
    """Test teardown after a client ``proc`` was to be killed: kill it if it still runs, kill
    whatever of ``pids`` (its processes) is left, close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    for pid in running(pids):
        os.kill(pid, signal.SIGKILL)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
