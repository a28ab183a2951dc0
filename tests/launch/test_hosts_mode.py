"""Single-controller mode: one ``python -m monarch.launch --hosts local:2`` runs the ranks of
every host through the hosts' agents, and the job looks the same as with one launcher per node:
the workers' environment, the logs, the failure summary, restarts, and a DDP training's loss."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launch_helpers import Scripts, clean_env, free_port, monarch_launch
from multinode_helpers import DDP_PRELOAD, DDP_TRAIN, DUMP_ENV, launcher, read_envs, run_nodes

pytestmark = [pytest.mark.timeout(120)]

#: Legitimately different per run: the port of the store the launcher bound.
RANDOM = {"MASTER_PORT"}


def per_node_commands(backend: str, script: str, out: Path) -> list[list[str]]:
    """Two launchers, one per node, for the same 2 x 2 world."""
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-id", "job7"]
    if backend == "c10d":
        endpoint = f"127.0.0.1:{free_port()}"
        flags = [common + ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]] * 2
    else:
        port = str(free_port())
        flags = [
            common + ["--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", port]
            for n in (0, 1)
        ]
    return [launcher("monarch") + f + [script, str(out)] for f in flags]


def hosts_flags(backend: str) -> list[str]:
    flags = ["--hosts", "local:2", "--nproc-per-node", "2", "--rdzv-id", "job7"]
    if backend == "static":
        flags += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    return flags


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_every_rank_sees_the_environment_of_one_launcher_per_node(
    scripts: Scripts, tmp_path: Path, backend: str
) -> None:
    script = scripts.write("dump_env.py", DUMP_ENV)
    per_node, hosts = tmp_path / "per_node", tmp_path / "hosts"
    per_node.mkdir()
    hosts.mkdir()

    runs = run_nodes(per_node_commands(backend, script, per_node), timeout=90)
    assert [r.rc for r in runs] == [0, 0], runs
    run = monarch_launch(*hosts_flags(backend), script, str(hosts), timeout=90)
    assert run.rc == 0, run

    for rank, (mine, ref) in enumerate(zip(read_envs(hosts, 4), read_envs(per_node, 4), strict=True)):
        # The log tree of one launcher holds every rank: attempt_0/<rank>/ (per node: <local rank>).
        assert mine.pop("TORCHELASTIC_ERROR_FILE").endswith(f"attempt_0/{rank}/error.json")
        assert ref.pop("TORCHELASTIC_ERROR_FILE").endswith(f"attempt_0/{ref['LOCAL_RANK']}/error.json")
        differing = {k: (mine.get(k), ref.get(k)) for k in set(mine) | set(ref) if mine.get(k) != ref.get(k)}
        assert set(differing) <= RANDOM, f"rank {rank}: {differing}"
        assert (mine["RANK"], mine["GROUP_RANK"], mine["LOCAL_RANK"]) == (
            str(rank),
            str(rank // 2),
            str(rank % 2),
        )
    assert len({env["MASTER_PORT"] for env in read_envs(hosts, 4)}) == 1


FAIL_ON_RANK_3 = """
import os, sys, time
if os.environ["RANK"] == "3":
    sys.exit(3)
time.sleep(60)  # the workload of the other ranks: only the launcher's teardown ends it
"""


@pytest.mark.slow
def test_a_failure_on_one_host_stops_every_host_and_is_named(scripts: Scripts) -> None:
    script = scripts.write("fail.py", FAIL_ON_RANK_3)
    run = monarch_launch("--hosts", "local:2", "--nproc-per-node", "2", script, timeout=60)
    assert run.rc == 1, run
    assert run.seconds < 30, run  # the sleeping ranks were stopped, not waited for
    assert "rank      : 3 (local_rank: 1)" in run.err, run
    assert "exitcode  : 3" in run.err, run
    # The root cause names the host it ran on: its agent, node rank 1.
    root = run.err.split("Root Cause")[1]
    assert re.search(r"host      : unix:\S+ \(node_rank: 1\)", root), run


RESTART = """
import os, sys
attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
print(f"attempt {attempt} rank {rank} port {os.environ['MASTER_PORT']}", flush=True)
if attempt == "0" and rank == "2":
    sys.exit(1)
"""


@pytest.mark.slow
def test_a_failure_restarts_the_whole_job_with_a_fresh_rendezvous(scripts: Scripts, tmp_path: Path) -> None:
    script = scripts.write("restart.py", RESTART)
    logs = tmp_path / "logs"
    run = monarch_launch(
        "--hosts", "local:2", "--nproc-per-node", "2", "--max-restarts", "1",
        "--log-dir", str(logs), "--rdzv-id", "r", "-t", "3", script,
        timeout=90,
    )  # fmt: skip
    assert run.rc == 0, run
    (run_dir,) = logs.iterdir()
    ports: dict[int, set[str]] = {0: set(), 1: set()}
    # Attempt 0: rank 2 failed (the others may have been stopped before they printed).
    for attempt, ranks in ((0, [2]), (1, [0, 1, 2, 3])):
        for rank in ranks:
            text = (run_dir / f"attempt_{attempt}" / str(rank) / "stdout.log").read_text()
            assert text.startswith(f"attempt {attempt} rank {rank} port "), text
            ports[attempt].add(text.split()[-1])
            # -t copies every rank's lines to the console, prefixed with its global rank.
            assert f"[default{rank}]:{text.rstrip()}" in run.out, run
    assert len(ports[1]) == 1 and ports[0] != ports[1], ports  # every host restarted, on a new store


@pytest.mark.slow
def test_ddp_on_two_hosts_ends_with_the_loss_of_one_node(
    scripts: Scripts, tmp_path: Path, one_node_ddp_loss: float
) -> None:
    script = scripts.write("train.py", DDP_TRAIN)
    two_hosts = tmp_path / "2x2"
    run = monarch_launch(
        *DDP_PRELOAD, "--hosts", "local:2", "--nproc-per-node", "2", script, str(two_hosts), timeout=100
    )
    assert run.rc == 0, run
    single, multi = one_node_ddp_loss, float(two_hosts.read_text())
    assert single < 100.0  # it trained (the untrained loss is in the hundreds)
    assert multi == pytest.approx(single, abs=1e-6)


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--hosts", "local:2", "--nnodes", "2"], {}, "--hosts and --nnodes=2:2 do not go together"),
        (["--hosts", " "], {}, "error: --hosts is empty"),
        (["--hosts", "tcp:127.0.0.1:1"], {}, "no secret to attach to the host agents with"),
        (
            ["--hosts", "unix:/nonexistent/agent.sock"],
            {"MONARCH_HOST_SECRET": "s"},
            "nobody listens at host agent",
        ),
    ],
)
def test_hosts_that_cannot_be_used_are_a_clear_error(
    scripts: Scripts, flags: list[str], env: dict[str, str], message: str
) -> None:
    script = scripts.write("never.py", "raise SystemExit('never started')\n")
    run = monarch_launch(*flags, script, env=clean_env(**env), timeout=30)
    assert run.rc == 1, run
    assert message in run.err and "HINT" in run.err, run
    assert "never started" not in run.err, run
