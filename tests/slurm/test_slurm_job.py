"""``monarch.job.SlurmJob`` from outside an allocation, on the throw-away cluster: ``state()``
submits one batch job of two nodes whose agents the client attaches to (a ``{"hosts": 2}``
mesh in node-list order, procs on their own node); a second program re-attaches to the same
job from the cached state without submitting again; ``kill()`` cancels it and nothing of the
job is left on either node. The secret is on no command line and in no file others can read."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import psutil
import pytest
import slurm_cluster
from helpers import IMPORT_TEST_MODULES, running, wait_until

from monarch.job import SlurmJob

pytestmark = pytest.mark.timeout(120)

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json, sys
from actors import Where
from monarch.job import SlurmJob

job = SlurmJob(meshes={"trainers": 2}, job_name="sj-test", monarch_port=22555)
trainers = job.state().trainers
procs = trainers.spawn_procs(per_host={"gpus": 1})
where = procs.spawn("where", Where)
places = where.where.call().get(timeout=30)
result = {
    "job_id": job.job_id,
    "extent": dict(trainers.extent),
    "places": sorted([point["hosts"], *place] for point, place in places.items()),
    "pids": list(where.pid.call().get(timeout=30).values()),
}
print("RESULT " + json.dumps(result), flush=True)
if sys.argv[1:] == ["kill"]:
    job.kill()
    print("KILLED", flush=True)
"""
)


def run_client(cluster: slurm_cluster.SlurmCluster, cwd: Path, *args: str) -> tuple[dict, str]:
    """Run CLIENT to its end outside any allocation; its result and its stdout."""
    client = cluster.client([], CLIENT, cwd, *args)
    out, err = client.communicate(timeout=90)
    assert client.returncode == 0, err
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, err
    return json.loads(line[len("RESULT ") :]), out


def jobs(cluster: slurm_cluster.SlurmCluster) -> list[str]:
    """Every job slurmctld knows, ended ones too (MinJobAge=300)."""
    return cluster.run(["squeue", "--noheader", "--states=all", "--format=%i"]).stdout.split()


def agents(cluster: slurm_cluster.SlurmCluster) -> list[psutil.Process]:
    found = [psutil.Process(pid) for pids in cluster.node_pids().values() for pid in pids]
    return [p for p in found if p.cmdline()[1:3] == ["-m", "monarch._src.host.slurm_job"]]


@pytest.mark.slow  # a batch job (about 2 s to start on a fresh cluster) and two clients
def test_submit_reattach_from_a_second_program_and_kill(
    slurm2: slurm_cluster.SlurmCluster, tmp_path: Path
) -> None:
    idle = slurm2.node_pids()

    first, _ = run_client(slurm2, tmp_path)

    assert first["extent"] == {"hosts": 2}
    # host i of the mesh is node i of the job's node list, its proc listening there
    assert [(host, name) for host, name, _ in first["places"]] == [(0, "n1"), (1, "n2")]
    for _, name, address in first["places"]:
        assert address.startswith(f"tcp:{slurm2.node_host(name).address}:"), first
    # The first client is gone: its procs went with it, the job and its agents run on.
    wait_until(lambda: not running(first["pids"]), 15, "the first client's procs to exit")
    assert slurm_cluster_job_state(slurm2, first["job_id"]) == "RUNNING"
    live_agents = agents(slurm2)
    assert len(live_agents) == 2
    cache = tmp_path / ".monarch" / "job_state.pkl"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    secret = json.loads(cache.read_text())["secret"]
    assert all(secret not in " ".join(p.cmdline()) for p in live_agents)

    second, out = run_client(slurm2, tmp_path, "kill")

    # The same job and agents, no second submission; then killed, nothing left.
    assert second["job_id"] == first["job_id"]
    assert jobs(slurm2) == [first["job_id"]]
    assert [(host, name) for host, name, _ in second["places"]] == [(0, "n1"), (1, "n2")]
    assert "KILLED" in out
    assert slurm_cluster_job_state(slurm2, first["job_id"]) == "CANCELLED"
    assert slurm2.node_pids() == idle  # kill() returned once SLURM had ended the job
    assert not cache.exists()


def slurm_cluster_job_state(cluster: slurm_cluster.SlurmCluster, job_id: str) -> str:
    done = cluster.run(["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T"])
    return done.stdout.strip()


def test_a_client_the_nodes_cannot_reach_is_refused_before_submitting(
    slurm2: slurm_cluster.SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = SlurmJob(meshes={"trainers": 2})
    with pytest.raises(
        ValueError, match=r"SLURM nodes cannot connect back to\nHINT: set MONARCH_TRANSPORT=tcp"
    ):
        job.state()
    assert jobs(slurm2) == []
    assert not (tmp_path / ".monarch").exists()


def test_a_cached_state_others_can_read_is_refused(
    slurm2: slurm_cluster.SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "state.json"
    cache.write_text(json.dumps({"kind": "monarch.job.SlurmJob", "job_id": "1", "secret": "s"}))
    os.chmod(cache, 0o644)
    with pytest.raises(ValueError, match=r"is not private to this user .*mode 644.*\nHINT: remove it"):
        SlurmJob(meshes={"trainers": 1}).state(cached_path=str(cache))
    assert jobs(slurm2) == []


def test_bad_meshes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"meshes\['trainers'\] must be a positive number of nodes, got 0"):
        SlurmJob(meshes={"trainers": 0})
    with pytest.raises(TypeError, match=r"HINT: slurm_args=\['--qos', 'high'\]"):
        SlurmJob(meshes={"trainers": 1}, slurm_args="--qos high")


BROKEN_CLIENT = """
import json
from monarch.job import SlurmJob

try:
    SlurmJob(meshes={"trainers": 2}, python_exe="/nonexistent/python", log_dir="logs", job_name="broken").state()
except RuntimeError as e:
    print("RESULT " + json.dumps(str(e)), flush=True)
"""


@pytest.mark.slow  # a batch job
def test_agents_that_cannot_start_say_where_the_output_is(
    slurm2: slurm_cluster.SlurmCluster, tmp_path: Path
) -> None:
    client = slurm2.client([], BROKEN_CLIENT, tmp_path)
    message = slurm_cluster.read_result(client)
    client.communicate(timeout=30)

    (job_id,) = jobs(slurm2)
    output = tmp_path / "logs" / f"broken-{job_id}.out"
    assert (
        f"SlurmJob: the host agents on n1, n2 did not listen at port 22222 (SLURM job {job_id} is FAILED"
        in message
    )
    assert f"the job's output is in {output}\nHINT: " in message
    assert "/nonexistent/python" in output.read_text()  # srun's own words about it
    assert not (tmp_path / ".monarch" / "job_state.pkl").exists()
