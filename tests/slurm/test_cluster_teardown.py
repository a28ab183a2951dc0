"""The throw-away cluster's own promises: it leaves nothing behind (no daemon, job process,
client of the cluster, namespace or file), whether its user finishes, fails to start it, is
interrupted or is killed (then the next run removes the leftovers)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import netns
import pytest
import slurm_cluster
from helpers import IMPORT_TEST_MODULES, REPO, running, wait_gone, wait_until

pytestmark = pytest.mark.timeout(60)

#: slurmctld and munged, then slurmd, the step's slurmstepd and its task on each of 2 nodes.
BUSY = 2 + 2 * 3

#: A client that brings a cluster up, starts a step on both nodes, says where everything is,
#: then waits to be interrupted or killed.
HOLDER = (
    IMPORT_TEST_MODULES
    + f"""
import json, signal, subprocess, time, slurm_cluster
with slurm_cluster.SlurmCluster(2) as c:
    srun = subprocess.Popen(["srun", "--nodes=2", "sleep", "600"], env=c.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while len(c.all_pids()) < {BUSY}:
        time.sleep(0.02)
    print(json.dumps({{"dir": str(c.dir), "run": c.hosts.run_id, "pids": c.all_pids() + [srun.pid]}}), flush=True)
    signal.pause()
"""
)


@dataclass
class Traces:
    """Where a cluster lives: its directory, its namespaces' run id, its processes."""

    dir: Path
    run: str
    pids: list[int]

    def assert_gone(self) -> None:
        assert not self.dir.exists()
        assert netns.names_of(self.run) == []
        assert wait_gone(self.pids) == []


def _start_holder() -> tuple[subprocess.Popen[str], Traces]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    line = holder.stdout.readline()
    if not line:
        holder.kill()
        pytest.fail(f"the cluster holder failed: {holder.communicate(timeout=30)[1]}")
    where = json.loads(line)
    return holder, Traces(Path(where["dir"]), where["run"], where["pids"])


def test_close_leaves_nothing(slurm_ready: None) -> None:
    with slurm_cluster.SlurmCluster(2) as cluster:
        srun = subprocess.Popen(["srun", "--nodes=2", "sleep", "600"], env=cluster.env)
        pids = wait_until(lambda: len(found := cluster.all_pids()) >= BUSY and found, 30, "the step")
        traces = Traces(cluster.dir, cluster.hosts.run_id, [*pids, srun.pid])
    try:
        traces.assert_gone()  # srun too: a client of the cluster ends with it
    finally:
        srun.kill()
        srun.wait(10)


def test_an_interrupted_user_leaves_nothing(slurm_ready: None) -> None:
    holder, traces = _start_holder()
    holder.send_signal(signal.SIGINT)  # Ctrl-C: the `with` block's exit tears the cluster down
    holder.communicate(timeout=30)
    traces.assert_gone()


def test_a_killed_users_leftovers_go_on_the_next_start(slurm_ready: None) -> None:
    holder, traces = _start_holder()
    holder.kill()
    holder.communicate(timeout=30)
    assert running(traces.pids)
    assert traces.dir.exists()

    netns.remove_stale()
    assert traces.dir in slurm_cluster.remove_stale()

    traces.assert_gone()


def test_a_cluster_that_cannot_start_says_why_and_leaves_nothing(slurm_ready: None) -> None:
    class Misconfigured(slurm_cluster.SlurmCluster):
        def _write_conf(self) -> None:
            super()._write_conf()
            with self.conf.open("a") as conf:
                conf.write("NoSuchSetting=1\n")

    cluster = Misconfigured(2)
    with pytest.raises(slurm_cluster.SlurmClusterError) as failure:
        cluster.__enter__()
    assert "slurmctld" in str(failure.value)
    assert "NoSuchSetting" in str(failure.value)  # slurmctld's own complaint, from its log
    Traces(cluster.dir, cluster.hosts.run_id, []).assert_gone()
