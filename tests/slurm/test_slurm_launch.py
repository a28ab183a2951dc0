"""``python -m monarch.launch`` in a SLURM job of two nodes, on the throw-away cluster, with
nothing on its command line about nodes: once per node under ``srun`` it takes ``--nnodes``,
``--node-rank`` and the rendezvous from SLURM's variables; once in the batch script it runs the
workers of both nodes itself (single-controller, ``--hosts slurm``). Either way a DDP training
(gloo, CPU) on 2 nodes x 2 ranks ends with the loss of one node x 4 ranks."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import slurm_cluster
from helpers import REPO, wait_until

from monarch._src.host import slurm
from monarch._src.launch.slurm_env import rendezvous_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # three trainings of 4 ranks

TRAIN = [str(REPO / "examples" / "train_ddp.py"), "--epochs", "2", "--steps", "5"]
LAUNCH = [sys.executable, "-m", "monarch.launch", "--nproc-per-node"]
FINAL = re.compile(r"^final loss (\S+) \(world size 4, attempt 0\)$", re.M)


def launch_env(cluster: slurm_cluster.SlurmCluster | None) -> dict[str, str]:
    """The test's environment without settings of monarch or torchrun; on the cluster, gloo
    told which interface the nodes talk on (their names resolve nowhere)."""
    base = cluster.env if cluster is not None else dict(os.environ)
    env = {k: v for k, v in base.items() if not k.startswith(("MONARCH_", "PET_", "TORCHELASTIC_"))}
    if cluster is not None:
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    return env


def run_client(
    cluster: slurm_cluster.SlurmCluster, argv: list[str], timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    """A SLURM client command (srun, sbatch) with launch_env, from the repository."""
    return subprocess.run(
        argv, env=launch_env(cluster), cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def one_node_loss() -> str:
    """The final loss of the same training on this machine, 1 node x 4 ranks (the reference, not
    what is tested: its template imports torch and the torch._dynamo that DDP's constructor
    imports once for all 4 ranks)."""
    pytest.importorskip("torch")
    launch = [*LAUNCH[:-1], "--preload", "torch,torch._dynamo", LAUNCH[-1]]
    done = subprocess.run(
        [*launch, "4", *TRAIN], env=launch_env(None), cwd=REPO, capture_output=True, text=True, timeout=150
    )
    assert done.returncode == 0, done.stderr
    (loss,) = FINAL.findall(done.stdout)
    return loss


def test_one_launcher_per_node_under_srun_takes_the_shape_from_slurm(
    slurm2: slurm_cluster.SlurmCluster, one_node_loss: str
) -> None:
    done = run_client(slurm2, ["srun", "--nodes=2", "--ntasks-per-node=1", *LAUNCH, "2", *TRAIN])

    assert done.returncode == 0, done.stderr
    assert FINAL.findall(done.stdout) == [one_node_loss]
    n1, n2 = (slurm2.node_host(n).address for n in ("n1", "n2"))
    port = rendezvous_port("1")  # the cluster's first job
    for rank, here in enumerate((n1, n2)):
        derived = f"--nnodes=2 --node-rank={rank} --master-addr={n1} --master-port={port} --local-addr={here}"
        notice = f"SLURM step 1.0: {derived}"
        assert notice in done.stderr


def test_one_launcher_in_the_batch_script_runs_every_node(
    slurm2: slurm_cluster.SlurmCluster, one_node_loss: str, tmp_path: Path
) -> None:
    output = tmp_path / "job.out"
    batch = shlex.join([*LAUNCH, "2", *TRAIN])
    # not `sbatch --wait`, which looks at the job every 2 to 30 s
    job_id = slurm.submit(["--nodes=2", f"--output={output}", "--wrap", batch], launch_env(slurm2), str(REPO))
    wait_until(lambda: slurm.job(job_id).ended, 150, "the batch job to end")

    log = output.read_text()
    assert slurm.job(job_id).state == "COMPLETED", log
    assert FINAL.findall(log) == [one_node_loss]
    n1 = slurm2.node_host("n1").address
    assert (
        f"outside any job step: this launcher runs the workers of every node (--hosts slurm, --local-addr {n1})"
        in log
    )


def test_several_launchers_per_node_are_refused(slurm2: slurm_cluster.SlurmCluster) -> None:
    done = run_client(slurm2, ["srun", "--nodes=2", "--ntasks=4", *LAUNCH, "2", "--no-python", "true"])

    assert done.returncode == 1
    assert (
        "SLURM step 1.0 runs 4 tasks on 2 nodes, but monarch.launch runs one launcher per node" in done.stderr
    )
    assert "HINT: srun --ntasks-per-node=1 python -m monarch.launch" in done.stderr


def launch_true_on_each_node(
    cluster: slurm_cluster.SlurmCluster, *flags: str
) -> subprocess.CompletedProcess[str]:
    """One launcher per node under srun, with ``flags``, each running ``true`` on one rank."""
    command = ["srun", "--nodes=2", "--ntasks-per-node=1", *LAUNCH, "1", *flags, "--no-python", "true"]
    return run_client(cluster, command)


def test_a_port_given_is_the_one_used(slurm2: slurm_cluster.SlurmCluster) -> None:
    done = launch_true_on_each_node(slurm2, "--master-port=23456")

    assert done.returncode == 0, done.stderr
    n1 = slurm2.node_host("n1").address
    assert f"--nnodes=2 --node-rank=1 --master-addr={n1} --master-port=23456" in done.stderr


def test_a_shape_given_is_left_alone(slurm2: slurm_cluster.SlurmCluster) -> None:
    # each node a job of its own (the node names resolve nowhere here: hence --local-addr)
    done = launch_true_on_each_node(slurm2, "--nnodes=1", "--local-addr=127.0.0.1")

    assert done.returncode == 0, done.stderr
    assert "SLURM step" not in done.stderr
