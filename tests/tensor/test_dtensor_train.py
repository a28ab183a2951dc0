"""examples/dtensor_train.py: training written with distributed tensors on 4 procs matches the
same training in one process to 1e-5."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dtensor_train.py"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_distributed_training_matches_one_process() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"trained 25 steps on 4 procs; largest difference from one process: (\S+)", proc.stdout)
    assert found, proc.stdout
    assert float(found.group(1)) < 1e-5
