"""Single-controller mode across two network namespaces (two "hosts" with their own addresses
on a bridge, see ``tests/netns.py``): one launcher in the root namespace, listening on TCP at
the bridge's address, runs 2 ranks on each host's agent; a failure on host 1 stops host 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import netns
import pytest
from launch_helpers import REPO, Run, Scripts, clean_env, monarch_launch
from multinode_helpers import DUMP_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

AGENT_PORT = 4100  # each host has its own network stack


@pytest.fixture
def cluster_agents(tmp_path: Path) -> Iterator[tuple[netns.Cluster, str, str]]:
    """(the cluster, the agents' addresses for --hosts, their secret file)."""
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    secret = tmp_path / "secret"
    secret.write_text("netns-secret")
    secret.chmod(0o600)
    with netns.Cluster(2) as cluster:
        agents, addresses = [], []
        try:
            for i, host in enumerate(cluster.hosts):
                address = f"tcp:{host.address}:{AGENT_PORT}"
                argv = [
                    sys.executable,
                    "-m",
                    "monarch.host",
                    "--listen",
                    address,
                    "--secret-file",
                    str(secret),
                ]
                agent = cluster.popen(i, argv, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=REPO)
                agents.append(agent)
                assert f"listening on {address}" in agent.stderr.readline()  # type: ignore[union-attr]
                addresses.append(address)
            yield cluster, ",".join(addresses), str(secret)
        finally:
            for agent in agents:
                agent.terminate()
                agent.communicate(timeout=30)


def launch(cluster: netns.Cluster, hosts: str, secret: str, *args: str) -> Run:
    env = clean_env(
        MONARCH_TRANSPORT="tcp", MONARCH_TCP_BIND_HOST=cluster.bridge_address, MONARCH_HOST_SECRET_FILE=secret
    )
    flags = ["--hosts", hosts, "--nproc-per-node", "2", "--local-addr", cluster.bridge_address]
    return monarch_launch(*flags, *args, env=env, timeout=90)


def test_ranks_on_two_namespace_hosts_meet_at_the_launchers_store(
    cluster_agents: tuple[netns.Cluster, str, str], scripts: Scripts, tmp_path: Path
) -> None:
    cluster, hosts, secret = cluster_agents
    script = scripts.write("dump_env.py", DUMP_ENV)
    run = launch(cluster, hosts, secret, script, str(tmp_path))
    assert run.rc == 0, run
    envs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [(e["GROUP_RANK"], e["LOCAL_RANK"]) for e in envs] == [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ]
    assert {e["MASTER_ADDR"] for e in envs} == {cluster.bridge_address}  # --local-addr: reachable by all
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}


def test_a_failure_on_one_namespace_host_stops_the_other(
    cluster_agents: tuple[netns.Cluster, str, str], scripts: Scripts, tmp_path: Path
) -> None:
    cluster, hosts, secret = cluster_agents
    started = tmp_path / "started"
    started.mkdir()
    script = scripts.write(
        "fail.py",
        """
        import os, sys, time
        open(os.path.join(sys.argv[1], os.environ["RANK"]), "w").close()
        if os.environ["RANK"] == "3":
            while len(os.listdir(sys.argv[1])) < 4:  # until every rank runs
                time.sleep(0.05)
            sys.exit(3)
        time.sleep(60)  # the other ranks' workload: only the launcher's teardown ends it
        """,
    )
    run = launch(cluster, hosts, secret, script, str(started))
    assert run.rc == 1, run
    assert run.seconds < 30, run  # host 0's ranks were stopped (SIGTERM through their runner)
    root = run.err.split("Root Cause")[1]
    assert f"host      : tcp:{cluster.hosts[1].address}:{AGENT_PORT} (node_rank: 1)" in root, run
    assert "rank      : 3 (local_rank: 1)" in root and "exitcode  : 3" in root, run
    assert os.listdir(started) and len(os.listdir(started)) == 4
