"""``srun`` on the throw-away cluster: a step spans both nodes, each task in its node's own
namespace and hostname, with SLURM's task environment."""

from __future__ import annotations

import pytest
import slurm_cluster

pytestmark = pytest.mark.timeout(60)


def test_srun_runs_a_task_on_each_node(slurm2: slurm_cluster.SlurmCluster) -> None:
    done = slurm2.run(["srun", "--nodes=2", "--label", "hostname"])
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["0: n1", "1: n2"]


def test_srun_tasks_see_the_allocation(slurm2: slurm_cluster.SlurmCluster) -> None:
    fields = "SLURM_JOB_NODELIST SLURM_NNODES SLURM_NODEID SLURM_PROCID SLURM_STEP_NODELIST".split()
    script = " ".join(f"${{{name}:-unset}}" for name in fields)
    done = slurm2.run(["srun", "--nodes=2", "sh", "-c", f'echo "$(hostname) {script}"'])
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        "n1 n[1-2] 2 0 0 n[1-2]",
        "n2 n[1-2] 2 1 1 n[1-2]",
    ]
