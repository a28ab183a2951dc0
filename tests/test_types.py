"""The package's type hints hold: mypy finds no errors (``[tool.mypy]`` in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_mypy_finds_no_errors():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", os.devnull], capture_output=True, text=True, timeout=280, cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
