"""``python -m monarch.launch`` in a batch script of two nodes (one launcher running the workers
of both through srun-started agents) when the job breaks: one node's agent killed with SIGKILL
is a launcher failure (the summary, exit code 1) within seconds, and so is ``scancel`` of the
job; either way the job ends and no process of it is left on either node."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest
import slurm_cluster
from helpers import REPO, running, wait_until

from monarch._src.host import slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # a batch job and four ranks

#: Each rank records its pid (written aside, then renamed: a file listed is never empty), then
#: waits to be stopped.
RANK = """
import os, sys, time
path = os.path.join(sys.argv[1], os.environ["RANK"])
with open(path + ".tmp", "w") as fp:
    fp.write(str(os.getpid()))
os.rename(path + ".tmp", path)
time.sleep(60)
"""


@pytest.mark.parametrize("fault", slurm_cluster.JOB_FAULTS)
def test_a_broken_job_stops_the_launcher_within_seconds_and_leaves_nothing(
    slurm2: slurm_cluster.SlurmCluster, tmp_path: Path, fault
) -> None:
    idle = slurm2.node_pids()
    script, ranks = tmp_path / "rank.py", tmp_path / "ranks"
    script.write_text(RANK)
    ranks.mkdir()
    launch = [sys.executable, "-m", "monarch.launch", "--nproc-per-node", "2", str(script), str(ranks)]
    output = tmp_path / "job.out"
    job_id = slurm.submit(["--nodes=2", f"--output={output}", "--wrap", shlex.join(launch)], cwd=str(REPO))

    def recorded() -> list[str]:
        return [r for r in os.listdir(ranks) if not r.endswith(".tmp")]

    wait_until(lambda: len(recorded()) == 4, 60, "every rank to run")
    pids = [int((ranks / r).read_text()) for r in recorded()]

    broken = time.monotonic()
    slurm2.break_job(fault, job_id, "monarch._src.host.slurm_hosts")
    wait_until(lambda: slurm.job(job_id).ended, 30, "the job to end")
    ended = time.monotonic() - broken

    assert ended < 10, ended
    if fault == "agent-killed":
        log = output.read_text()
        assert slurm.job(job_id).state == "FAILED", log
        assert "monarch.launch.ChildFailedError" in log, log
        n2 = slurm2.node_host("n2").address
        assert re.search(
            rf"Root Cause .*\n.*\n  time .*\n  host      : tcp:{n2}:\d+ \(node_rank: 1\)", log
        ), log
    wait_until(lambda: slurm2.node_pids() == idle, 15, "the nodes to be idle")
    assert not running(pids)
