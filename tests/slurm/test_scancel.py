"""``scancel`` on the throw-away cluster: cancelling a running step ends its tasks on every
node; nothing of the step is left in either node's namespace."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import slurm_cluster
from helpers import running, wait_until

pytestmark = pytest.mark.timeout(60)


def test_scancel_ends_a_step_on_both_nodes(slurm2: slurm_cluster.SlurmCluster, tmp_path: Path) -> None:
    slurmds = slurm2.node_pids()
    # Each task writes its pid to a file of the shared filesystem, then waits (for ever).
    task = f"echo $$ > {tmp_path}/$(hostname).pid && exec sleep 600"
    srun = subprocess.Popen(
        ["srun", "--nodes=2", "--job-name=victim", "sh", "-c", task],
        env=slurm2.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid_files = [tmp_path / f"{name}.pid" for name in slurm2.node_names]
        wait_until(lambda: all(f.exists() and f.read_text().strip() for f in pid_files), 30, "both tasks")
        tasks = [int(f.read_text()) for f in pid_files]
        for name, pid in zip(slurm2.node_names, tasks):
            assert pid in slurm2.pids(name)
        job = slurm2.run(["squeue", "--noheader", "--name=victim", "--format=%A"]).stdout.strip()

        done = slurm2.run(["scancel", f"{job}.0"])

        assert done.returncode == 0, done.stderr
        assert srun.wait(timeout=30) != 0
        assert running(tasks) == []
        # Only slurmd stays in each node: the step's slurmstepd and its tasks are gone.
        wait_until(
            lambda: slurm2.node_pids() == slurmds,
            15,
            "the step to leave both nodes",
        )
    finally:
        if srun.poll() is None:
            srun.kill()
        srun.communicate(timeout=10)
