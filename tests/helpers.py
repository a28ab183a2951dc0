"""Helpers shared by test modules (importable as ``helpers``: pytest puts ``tests/`` on the path
for its conftest)."""

from __future__ import annotations

import time
from typing import Any, Callable

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
