"""Fixtures of the launcher tests; the helpers live in ``launch_helpers``."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from launch_helpers import Scripts


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[Scripts]:
    """A scripts directory; after the test, nothing started from it may still run."""
    s = Scripts(tmp_path / "scripts")
    yield s
    marker = str(s.root)

    def leftovers() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if p.pid != os.getpid() and any(marker in c for c in (p.info["cmdline"] or [])):
                    if p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return found

    deadline = time.monotonic() + 10
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftovers()
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, f"processes left behind: {[(p.pid, p.info['cmdline']) for p in left]}"
