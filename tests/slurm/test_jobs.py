"""``monarch._src.host.slurm`` from outside a job, on the real SLURM 22.05 cluster: submit
with sbatch, read the job's state and nodes from ``squeue --json``, cancel with scancel, and
clear errors when a job fails, is cancelled, is unknown or is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import slurm_cluster
from helpers import wait_until

from monarch._src.host import slurm

pytestmark = pytest.mark.timeout(60)
#: The first batch job of a fresh cluster waits about 2 s for the scheduler.
first_batch_job = pytest.mark.slow


@first_batch_job
def test_submit_wait_read_and_cancel(slurm2: slurm_cluster.SlurmCluster, tmp_path: Path) -> None:
    job_id = slurm.submit(["--nodes=2", "--wrap", "srun sleep 600"], cwd=str(tmp_path))

    running = slurm.wait_running(job_id, timeout=30)

    assert (running.job_id, running.state, running.nodelist) == (job_id, "RUNNING", "n[1-2]")
    assert running.nodes == ("n1", "n2")
    assert not running.ended
    slurm.cancel(job_id)
    wait_until(lambda: slurm.job(job_id).ended, 15, "the cancelled job to end")
    cancelled = slurm.job(job_id)
    assert cancelled.state == "CANCELLED"
    assert cancelled.nodes == ("n1", "n2")
    with pytest.raises(slurm.SlurmJobEnded, match=rf"SLURM job {job_id} is CANCELLED .*\nHINT: ") as ended:
        slurm.wait_running(job_id, timeout=30)
    assert ended.value.job.state == "CANCELLED"


@first_batch_job
def test_a_failed_job_is_an_error_with_its_exit_code(
    slurm2: slurm_cluster.SlurmCluster, tmp_path: Path
) -> None:
    job_id = slurm.submit(["--nodes=1", "--wrap", "echo broken >&2; exit 3"], cwd=str(tmp_path))
    wait_until(lambda: slurm.job(job_id).ended, 30, "the job to end")

    failed = slurm.job(job_id)
    with pytest.raises(slurm.SlurmJobEnded) as ended:
        slurm.wait_running(job_id, timeout=30)

    assert (failed.state, failed.exit_code, failed.signal, failed.reason) == (
        "FAILED",
        3,
        None,
        "NonZeroExitCode",
    )
    assert ended.value.job == failed
    message = str(ended.value)
    assert f"SLURM job {job_id} is FAILED (reason: NonZeroExitCode) exit code 3" in message
    assert f"its output is in {tmp_path}/slurm-{job_id}.out unless sbatch had --output" in message
    assert "HINT: read the job's output file" in message
    assert (tmp_path / f"slurm-{job_id}.out").read_text() == "broken\n"


def test_a_refused_submission_says_what_sbatch_said(slurm2: slurm_cluster.SlurmCluster) -> None:
    with pytest.raises(
        slurm.SlurmError,
        match=r"(?s)`sbatch --parsable --partition=nosuch .*` failed .*Invalid partition.*\nHINT: ",
    ):
        slurm.submit(["--partition=nosuch", "--wrap", "true"])


def test_an_unknown_job_is_an_error(slurm2: slurm_cluster.SlurmCluster) -> None:
    with pytest.raises(slurm.SlurmError, match=r"SLURM does not know job 4242\nHINT: "):
        slurm.job(4242)
