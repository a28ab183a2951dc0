"""Fixtures of the launcher tests; the helpers live in ``launch_helpers``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import alive, kill_leftovers, wait_while
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
            if p.pid != os.getpid() and any(marker in c for c in (p.info["cmdline"] or [])):
                found.append(p)
        return alive(found)

    left = wait_while(leftovers)
    kill_leftovers(left)
    assert not left, f"processes left behind: {[(p.pid, p.info['cmdline']) for p in left]}"
