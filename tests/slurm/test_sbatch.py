"""``sbatch`` on the throw-away cluster: a batch job of two nodes runs its script on the first
node and a step on both; the job's output lands in the (shared) submit directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import slurm_cluster
from helpers import wait_until

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.slow,
]  # the first batch job waits ~2 s for a scheduler pass


def test_batch_job_runs_on_both_nodes(slurm2: slurm_cluster.SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho batch on $(hostname)\nsrun --label hostname\n")
    done = slurm2.run(["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", str(script)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()

    def state() -> str:
        return slurm2.run(
            ["squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T"]
        ).stdout.strip()

    wait_until(lambda: state() in ("COMPLETED", "FAILED", "CANCELLED"), timeout=30, what=f"job {job} to end")
    assert state() == "COMPLETED"
    output = (tmp_path / f"slurm-{job}.out").read_text().splitlines()
    assert output[0] == "batch on n1"
    assert sorted(output[1:]) == ["0: n1", "1: n2"]
