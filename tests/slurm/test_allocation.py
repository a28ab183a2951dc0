"""``monarch._src.host.slurm.allocation``: a process inside a SLURM allocation learns the job,
its nodes in SLURM's order and which node it is on, from SLURM's variables, on the real
cluster."""

from __future__ import annotations

import json
import sys

import pytest
import slurm_cluster
from helpers import REPO

from monarch._src.host import slurm

pytestmark = pytest.mark.timeout(60)

REPORT = (
    "import json, socket; from monarch._src.host import slurm; a = slurm.allocation(); "
    "print(json.dumps([socket.gethostname(), a.job_id, list(a.nodes), a.num_nodes, a.node_index]))"
)


def test_each_task_of_a_step_knows_its_node(slurm2: slurm_cluster.SlurmCluster) -> None:
    done = slurm2.run(["srun", "--nodes=2", sys.executable, "-c", REPORT], cwd=REPO)
    assert done.returncode == 0, done.stderr
    reports = sorted(json.loads(line) for line in done.stdout.splitlines())
    job_id = reports[0][1]
    assert reports == [
        ["n1", job_id, ["n1", "n2"], 2, 0],
        ["n2", job_id, ["n1", "n2"], 2, 1],
    ]


def test_an_salloc_shell_knows_the_nodes_but_is_on_none(slurm2: slurm_cluster.SlurmCluster) -> None:
    done = slurm2.run(["salloc", "--nodes=2", sys.executable, "-c", REPORT], cwd=REPO)
    assert done.returncode == 0, done.stderr
    hostname, _, nodes, count, index = json.loads(done.stdout)
    assert (nodes, count, index) == (["n1", "n2"], 2, None)
    assert hostname not in nodes  # the shell runs where salloc runs


def test_variables_of_different_allocations_are_refused(slurm2: slurm_cluster.SlurmCluster) -> None:
    env = dict(slurm2.env, SLURM_JOB_ID="7", SLURM_JOB_NODELIST="n[1-2]", SLURM_NNODES="3")
    with pytest.raises(slurm.SlurmError, match=r"names 2 nodes but SLURM_NNODES=3\nHINT: "):
        slurm.allocation(env)


def test_outside_an_allocation_says_so() -> None:
    with pytest.raises(
        slurm.SlurmError, match=r"not inside a SLURM allocation.*\nHINT: run this under sbatch"
    ):
        slurm.allocation({"PATH": "/usr/bin:/bin"})


def test_missing_slurm_commands_say_what_to_install() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "PATH": "/nonexistent"}
    with pytest.raises(slurm.SlurmError, match=r"`scontrol` not found.*\nHINT: .*slurm-client"):
        slurm.allocation(env)
