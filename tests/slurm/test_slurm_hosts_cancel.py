"""``hosts_from_config("slurm")`` when things go wrong: agents that cannot be started give an
error with srun's own words; cancelling the agents' step (``scancel``) is a host failure the
client hears of within seconds, and nothing of the mesh survives on either node."""

from __future__ import annotations

import time

import pytest
import slurm_cluster
from helpers import IMPORT_TEST_MODULES, alive, wait_until

from monarch.actor import hosts_from_config

pytestmark = pytest.mark.timeout(90)

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json, threading
from actors import Pid
from monarch.actor import hosts_from_config

hosts = hosts_from_config("MONARCH_TEST_HOSTS")
procs = hosts.spawn_procs(per_host={"gpus": 1})
pids = procs.spawn("pid", Pid).pid.call().get(timeout=30)
print("RESULT " + json.dumps(list(pids.values())), flush=True)
threading.Event().wait(60)  # the test cancels the hosts' step: the fault hook ends this client
print("NO FAILURE SEEN", flush=True)
"""
)


def test_agents_that_cannot_start_say_why(
    slurm2: slurm_cluster.SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An allocation that SLURM does not know: srun refuses to start the step.
    for key, value in {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NNODES": "2"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MONARCH_TEST_HOSTS", "slurm")
    with pytest.raises(RuntimeError) as failure:
        hosts_from_config("MONARCH_TEST_HOSTS")
    message = str(failure.value)
    assert "the host agents of SLURM job 4242 did not start: srun exited with code 1" in message
    assert "Invalid job id" in message  # srun's own words
    assert "\nHINT: " in message


@pytest.mark.slow  # the step takes a few seconds to end after scancel
def test_cancelling_the_agents_step_fails_the_mesh_and_leaves_nothing(
    slurm2: slurm_cluster.SlurmCluster,
) -> None:
    idle = slurm2.node_pids()
    client = slurm2.allocation_client(CLIENT, MONARCH_TEST_HOSTS="slurm")
    try:
        procs = slurm_cluster.read_result(client)
        steps = slurm2.run(["squeue", "--steps", "--noheader", "--format=%i %j"]).stdout.split("\n")
        step = next(s.split()[0] for s in steps if s.endswith(" monarch-hosts"))

        cancelled = time.monotonic()
        assert slurm2.run(["scancel", step]).returncode == 0
        out, err = client.communicate(timeout=30)
        detected = time.monotonic() - cancelled

        assert client.returncode != 0 and "NO FAILURE SEEN" not in out, err
        # The failure names the procs' host lost, or their kill by SLURM, whichever came first.
        assert "and all its descendants have failed" in err, err
        assert detected < 10, detected
        wait_until(
            lambda: slurm2.node_pids() == idle,
            15,
            "the nodes to be idle",
        )
        # A zombie counts as gone: the killed agent's orphans are reaped by init (not ours here).
        assert not alive(procs)
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate(timeout=30)
