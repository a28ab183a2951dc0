"""Multi-node ``python -m monarch.launch`` across two network namespaces (two "hosts" with
their own addresses on a bridge, see ``tests/netns.py``), side by side with real torchrun."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import netns
import pytest
from launch_helpers import TORCHRUN, Run, Scripts, clean_env
from multinode_helpers import DUMP_ENV, finish, launcher, read_envs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed"),
]

PORT = 29400  # each host has its own network stack, so the default port is free in it


@pytest.fixture
def cluster2() -> Iterator[netns.Cluster]:
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with netns.Cluster(2) as cluster:
        yield cluster


def start_on_hosts(cluster: netns.Cluster, tool: str, nproc: int, *script: str) -> list[Run]:
    """One launcher per host, the store on host 0's address; their runs."""
    h0 = cluster.hosts[0].address
    procs = []
    for i, host in enumerate(cluster.hosts):
        argv = launcher(tool) + [
            "--nnodes", "2", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{h0}:{PORT}", "--rdzv-id", "nsjob", "--local-addr", host.address,
            # torchrun hosts the store only where the endpoint matches the hostname (not an
            # address of a namespace) or is_host says so.
            "--rdzv-conf", f"is_host={int(i == 0)}",
            *script,
        ]  # fmt: skip
        procs.append(cluster.popen(i, argv, env=clean_env(), stdout=-1, stderr=-1, text=True))
    return finish(procs, timeout=90)


def run_on_hosts(cluster: netns.Cluster, tool: str, script: str, out: Path) -> list[dict[str, str]]:
    out.mkdir()
    runs = start_on_hosts(cluster, tool, 2, script, str(out))
    assert [r.rc for r in runs] == [0, 0], runs
    return read_envs(out, 4)


def test_two_hosts_rendezvous_into_torchruns_ranks_and_environment(
    cluster2: netns.Cluster, scripts: Scripts, tmp_path: Path
) -> None:
    script = scripts.write("dump_env.py", DUMP_ENV)
    ours = run_on_hosts(cluster2, "monarch", script, tmp_path / "monarch")
    theirs = run_on_hosts(cluster2, "torchrun", script, tmp_path / "torchrun")
    h0, h1 = (h.address for h in cluster2.hosts)
    for rank, (mine, ref) in enumerate(zip(ours, theirs, strict=True)):
        for env in (mine, ref):
            del env["TORCHELASTIC_ERROR_FILE"]  # under each launcher's own temporary log dir
        differing = {k: (mine.get(k), ref.get(k)) for k in set(mine) | set(ref) if mine.get(k) != ref.get(k)}
        assert set(differing) <= {"MASTER_PORT"}, f"rank {rank}: {differing}"
        # The workers' store is on group rank 0's host, at its --local-addr.
        assert mine["MASTER_ADDR"] == h0
        assert mine["GROUP_RANK"] == str(rank // 2)
    assert h0 < h1  # group ranks follow the sorted addresses, as in torchrun


def test_a_failure_on_one_host_stops_the_other_at_once(cluster2: netns.Cluster, scripts: Scripts) -> None:
    script = scripts.write(
        "fail.py",
        """
        import os, sys, time
        if os.environ["GROUP_RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
        """,
    )
    runs = start_on_hosts(cluster2, "monarch", 1, script)
    assert [r.rc for r in runs] == [1, 1], runs
    for run in runs:
        assert f"host      : {socket.getfqdn()} (node_rank: 1)" in run.err, run
        assert "exitcode  : 3" in run.err, run
        assert run.seconds < 30, run  # not the 60 s host 0's rank sleeps
