"""``SlurmJob`` when its job breaks under a running client: one node's agent killed with
SIGKILL, or the whole job cancelled with ``scancel``, is a host failure the client hears of
within seconds (its fault hook ends it), and nothing of the job is left on either node."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import slurm_cluster
from helpers import IMPORT_TEST_MODULES, running, wait_until

from monarch._src.host import slurm

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]  # a batch job per test

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json, threading
from actors import Pid
from monarch.job import SlurmJob

job = SlurmJob(meshes={"trainers": 2}, job_name="sj-fail", monarch_port=22556)
procs = job.state().trainers.spawn_procs(per_host={"gpus": 1})
pids = procs.spawn("pid", Pid).pid.call().get(timeout=30)
print("RESULT " + json.dumps({"job_id": job.job_id, "pids": list(pids.values())}), flush=True)
threading.Event().wait(60)  # the test breaks the job: the fault hook ends this client
print("NO FAILURE SEEN", flush=True)
"""
)


@pytest.mark.parametrize("fault", slurm_cluster.JOB_FAULTS)
def test_a_broken_job_fails_the_mesh_within_seconds_and_leaves_nothing(
    slurm2: slurm_cluster.SlurmCluster, tmp_path: Path, fault
) -> None:
    idle = slurm2.node_pids()
    client = slurm2.client([], CLIENT, tmp_path)
    try:
        result = slurm_cluster.read_result(client)

        broken = time.monotonic()
        slurm2.break_job(fault, result["job_id"], "monarch._src.host.slurm_job")
        out, err = client.communicate(timeout=30)
        detected = time.monotonic() - broken

        assert client.returncode != 0 and "NO FAILURE SEEN" not in out, err
        assert "and all its descendants have failed" in err, err
        assert detected < 10, detected
        # The job ended with its agent (or its cancel): no process of it on any node.
        wait_until(lambda: slurm2.node_pids() == idle, 15, "the nodes to be idle")
        assert not running(result["pids"])
        ended = wait_until(lambda: slurm.job(result["job_id"]).ended, 15, "the job to end")
        assert ended
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate(timeout=30)
