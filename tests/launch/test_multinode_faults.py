"""Multi-node ``python -m monarch.launch`` when something fails: a worker on one node, a restart
budget shared by the job, a launcher killed -9, a node that joins an elastic job late.

torchrun leaves the other nodes running until the exit barrier (300 s) or the collective's own
timeout, and counts restarts per node; these tests pin down that ours do better."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import wait_until
from launch_helpers import Scripts, free_port
from multinode_helpers import finish, launcher, listening, run_nodes, start_nodes

pytestmark = pytest.mark.timeout(90)

#: Records "<rank>_<world size>_<restart count>" in argv[1], then fails or waits as told by argv[2:].
WORKER = """
import os, sys, time
out, mode = sys.argv[1], sys.argv[2]
rank, restart = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
tag = f"{rank}_{os.environ['WORLD_SIZE']}_{restart}"
with open(os.path.join(out, tag), "a") as fp:
    fp.write(f"{os.getpid()}\\n")
fails = {"fail_rank1": True, "fail_rank1_once": restart == "0", "fail_rank1_sleep0": True}
if rank == "1" and fails.get(mode):
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(out, f"0_2_{restart}")) and time.monotonic() < deadline:
        time.sleep(0.01)  # fail once rank 0 (on the other node) runs in this round too
    sys.exit(3)
if mode == "together_wait" and os.environ["WORLD_SIZE"] == "2":
    time.sleep(60)  # until the other node's launcher is killed and the group restarts
if mode == "alone_waits" and os.environ["WORLD_SIZE"] == "1":
    time.sleep(60)  # until the second node joins and the group restarts
if mode == "sleep" or (mode == "fail_rank1_sleep0" and rank == "0"):
    time.sleep(60)
"""


def static_nodes(script: str, out: Path, mode: str, *flags: str) -> list[list[str]]:
    port = str(free_port())
    return [
        launcher("monarch")
        + ["--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", port]
        + [*flags, script, str(out), mode]
        for n in (0, 1)
    ]


def c10d_nodes(script: str, out: Path, mode: str, *flags: str, nnodes: str = "2") -> list[list[str]]:
    endpoint = f"127.0.0.1:{free_port()}"
    argv = launcher("monarch") + [
        "--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "faults", *flags, script, str(out), mode,
    ]  # fmt: skip
    return [argv, argv]


def ran(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """Where the workers record that they ran."""
    path = tmp_path / "ran"
    path.mkdir()
    return path


def test_a_failure_on_one_node_stops_every_node_with_the_summary(scripts: Scripts, out: Path) -> None:
    script = scripts.write("worker.py", WORKER)
    # Rank 0 sleeps for a minute unless stopped; rank 1 (on node 1) exits 3 at once.
    runs = run_nodes(c10d_nodes(script, out, "fail_rank1_sleep0"), timeout=60)
    assert [r.rc for r in runs] == [1, 1], runs
    for run in runs:
        summary = run.err[run.err.index("ChildFailedError") :]
        assert re.search(
            r"host\s+: \S+ \(node_rank: 1\)\n\s+rank\s+: 1 \(local_rank: 0\)\n\s+exitcode\s+: 3", summary
        ), run
        assert run.seconds < 30, run  # not the 60 s rank 0 would sleep
    assert ran(out) == ["0_2_0", "1_2_0"]


@pytest.mark.parametrize("nodes", [c10d_nodes, static_nodes], ids=["c10d", "static"])
def test_restarts_are_counted_for_the_job_and_every_node_restarts(
    scripts: Scripts, out: Path, nodes: Callable[..., list[list[str]]]
) -> None:
    script = scripts.write("worker.py", WORKER)
    runs = run_nodes(nodes(script, out, "fail_rank1_once", "--max-restarts", "1"), timeout=60)
    assert [r.rc for r in runs] == [0, 0], runs
    # Both nodes ran a second round, and both see restart 1 (torchrun: 0 on the healthy node).
    assert ran(out) == ["0_2_0", "0_2_1", "1_2_0", "1_2_1"]


def test_the_restart_budget_is_the_jobs(scripts: Scripts, out: Path) -> None:
    script = scripts.write("worker.py", WORKER)
    runs = run_nodes(c10d_nodes(script, out, "fail_rank1", "--max-restarts", "1"), timeout=60)
    assert [r.rc for r in runs] == [1, 1], runs
    # One restart for the whole job: each rank ran twice, not once more per node.
    assert ran(out) == ["0_2_0", "0_2_1", "1_2_0", "1_2_1"]
    assert all(len((out / name).read_text().split()) == 1 for name in ran(out))


def test_a_launcher_stopped_by_a_signal_stops_the_other_node(scripts: Scripts, out: Path) -> None:
    script = scripts.write("worker.py", WORKER)
    procs = start_nodes(c10d_nodes(script, out, "sleep"))
    wait_until(lambda: len(ran(out)) == 2, timeout=30, what="both nodes' workers running")
    os.kill(procs[0].pid, signal.SIGTERM)
    runs = finish(procs, timeout=30)
    assert [r.rc for r in runs] == [1, 1], runs
    assert "SignalException: Process" in runs[0].err, runs[0]
    assert re.search(r"the launcher of node \d was stopped by signal 15", runs[1].err), runs[1]


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["joiner", "store host"])
def test_a_launcher_killed_9_is_noticed_by_the_other_within_seconds(
    scripts: Scripts, out: Path, victim: str
) -> None:
    script = scripts.write("worker.py", WORKER)
    host_cmd, joiner_cmd = c10d_nodes(
        script, out, "sleep", "--rdzv-conf", "keep_alive_interval=1,keep_alive_max_attempt=2"
    )
    port = int(host_cmd[host_cmd.index("--rdzv-endpoint") + 1].split(":")[1])
    host = start_nodes([host_cmd])[0]
    wait_until(lambda: listening(port), timeout=30, what="the first launcher hosting the store")
    joiner = start_nodes([joiner_cmd])[0]
    wait_until(lambda: len(ran(out)) == 2, timeout=30, what="both nodes' workers running")
    killed, survivor = (joiner, host) if victim == "joiner" else (host, joiner)
    os.kill(killed.pid, signal.SIGKILL)
    start = time.monotonic()
    [run] = finish([survivor], timeout=30)
    detected = time.monotonic() - start
    killed.wait(timeout=10)
    assert run.rc == 1, run
    expected = "sent no heartbeat" if victim == "joiner" else "did the launcher hosting it die?"
    assert expected in run.err, run
    # interval x attempts (2 s) + one interval + the SIGTERM of the survivor's workers.
    assert detected < 6.0, (detected, run)


@pytest.mark.slow
def test_an_elastic_job_starts_with_min_nodes_and_a_late_node_joins_at_a_restart(
    scripts: Scripts, out: Path
) -> None:
    script = scripts.write("worker.py", WORKER)
    first, second = c10d_nodes(script, out, "alone_waits", "--rdzv-conf", "last_call_timeout=1", nnodes="1:2")
    port = int(first[first.index("--rdzv-endpoint") + 1].split(":")[1])
    [early] = start_nodes([first])
    wait_until(lambda: ran(out) == ["0_1_0"], timeout=30, what="the first node running alone")
    assert listening(port)
    [late] = start_nodes([second])
    runs = finish([early, late], timeout=60)
    assert [r.rc for r in runs] == [0, 0], runs
    # A membership change is not a restart: TORCHELASTIC_RESTART_COUNT stays 0.
    assert ran(out) == ["0_1_0", "0_2_0", "1_2_0"]


@pytest.mark.slow
def test_an_elastic_job_goes_on_without_a_lost_node(scripts: Scripts, out: Path) -> None:
    script = scripts.write("worker.py", WORKER)
    conf = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2"
    first, second = c10d_nodes(
        script, out, "together_wait", "--max-restarts", "1", "--rdzv-conf", conf, nnodes="1:2"
    )
    port = int(first[first.index("--rdzv-endpoint") + 1].split(":")[1])
    [host] = start_nodes([first])
    wait_until(lambda: listening(port), timeout=30, what="the first launcher hosting the store")
    [other] = start_nodes([second])
    wait_until(lambda: ran(out) == ["0_2_0", "1_2_0"], timeout=30, what="both nodes' workers running")
    os.kill(other.pid, signal.SIGKILL)
    [run] = finish([host], timeout=30)
    other.wait(timeout=10)
    assert run.rc == 0, run
    # The survivor restarted alone (a lost node uses up a restart) and finished.
    assert ran(out) == ["0_1_1", "0_2_0", "1_2_0"]
