"""examples/weight_sync.py runs: three inference replicas see each version the trainer makes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "weight_sync.py"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_weight_sync_example_runs() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=80)
    assert proc.returncode == 0, proc.stderr
    for version in (1, 2, 3):
        assert f"they see [({version}, {float(version)})]" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr
