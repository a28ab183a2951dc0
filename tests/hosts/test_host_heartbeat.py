"""A host lost without a clean goodbye is detected by heartbeat within ``host_heartbeat_timeout_s``,
across the namespace cluster: its session killed with -9, the whole host frozen (SIGSTOP of its
agent, session and procs), its link cut. Pending calls on it fail naming the host and the bound,
its mesh fails at the client's root, spawning there raises, and the other host keeps working.
A frozen host that resumes, or a cut host, does not come back: its procs and session exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import netns
import psutil
import pytest
from helpers import IMPORT_TEST_MODULES, REPO, end_client, running, wait_gone
from tcp_helpers import ClusterAgents

pytestmark = pytest.mark.timeout(90)

BOUND_S = 2
#: What detection may take past the bound: the last ping's round trip, a loaded machine.
SLACK_S = 1.5

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json, sys, threading, time
import monarch.actor
from actors import Pid
from helpers import wait_until
from monarch.actor import SupervisionError, endpoint, hosts_from_config

faults = []
monarch.actor.unhandled_fault_hook = faults.append


class Blocker(Pid):
    @endpoint
    def block(self) -> None:
        threading.Event().wait(120)


def out(**kw):
    print(json.dumps(kw), flush=True)


hosts = hosts_from_config("MONARCH_TEST_HOSTS")
procs = hosts.spawn_procs(per_host={"gpus": 1})
actors = procs.spawn("blocker", Blocker)
pids = actors.pid.call().get(timeout=30)
pending = actors.slice(hosts=1).block.call_one()
out(pids=[pid for _, pid in sorted((p["hosts"], pid) for p, pid in pids.items())])
try:
    pending.get(timeout=60)
    out(error=None)
except SupervisionError as e:
    out(error=str(e))
result = {"other_host": actors.slice(hosts=0).pid.call_one().get(timeout=30)}
try:
    hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 1})
except RuntimeError as e:
    result["spawn_error"] = str(e)
wait_until(lambda: faults, timeout=10, what="the MeshFailure")
result["faults"] = [[f.mesh_name, f.crashed_ranks] for f in faults]
procs.slice(hosts=0).stop().get(timeout=30)
out(**result)
"""
)


def lose_host_1(
    cluster: netns.Cluster,
    agents: ClusterAgents,
    fault: Callable[[int, int], None],
) -> tuple[dict[str, Any], float, list[int]]:
    """Run ``CLIENT``; once its call on host 1 is pending, ``fault(agent pid, session pid)``.
    Returns (the client's result, seconds from the fault to the call's failure, the pids of the
    client's procs and sessions on host 1)."""
    addresses, secret = agents.addresses, agents.secret
    env = {
        **os.environ,
        "MONARCH_TEST_HOSTS": ",".join(addresses),
        "MONARCH_TRANSPORT": "tcp",
        "MONARCH_TCP_BIND_HOST": cluster.bridge_address,
        "MONARCH_HOST_SECRET_FILE": secret,
        "MONARCH_HOST_HEARTBEAT_TIMEOUT_S": str(BOUND_S),
    }
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert client.stdout is not None
    pids: list[int] = []
    try:
        line = client.stdout.readline()
        assert line, f"the client died early (exit code {client.wait(10)})"
        pids = json.loads(line)["pids"]
        session = psutil.Process(pids[1]).ppid()
        agent = psutil.Process(session).ppid()
        start = time.monotonic()
        fault(agent, session)
        error = json.loads(client.stdout.readline())["error"]
        detected = time.monotonic() - start
        result = json.loads(client.stdout.readline() or "{}")
        assert client.wait(30) == 0
        result["error"] = error
        return result, detected, [pids[1], session]
    finally:  # host 1's processes are left to the test (and to the cluster's teardown)
        end_client(client, pids[:1])


def assert_host_1_lost(result: dict[str, Any], addresses: list[str], bound: bool) -> None:
    """The pending call failed naming host 1 (and the bound when heartbeats found it), the mesh
    failed there, spawning there raises, and host 0 answered."""
    assert result["error"] and addresses[1] in result["error"], result
    if bound:
        assert f"{BOUND_S}s" in result["error"] and "host_heartbeat_timeout_s" in result["error"], result
    assert result["other_host"] > 0, result
    assert addresses[1] in result["spawn_error"] and "lost" in result["spawn_error"], result
    assert result["faults"] == [["blocker", [1]]], result


def freeze(agent: int) -> list[int]:
    """SIGSTOP the agent, then everything under it (its sessions and their procs)."""
    pids = [agent] + [p.pid for p in psutil.Process(agent).children(recursive=True)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def test_a_session_killed_9_is_a_lost_host_at_once(
    cluster2: netns.Cluster, cluster2_agents: ClusterAgents
) -> None:
    result, detected, gone = lose_host_1(
        cluster2, cluster2_agents, lambda agent, session: os.kill(session, signal.SIGKILL)
    )
    assert_host_1_lost(result, cluster2_agents.addresses, bound=False)
    assert detected < BOUND_S, detected  # its connection closes: no need to wait for heartbeats
    assert wait_gone(gone) == []
    assert all(a.poll() is None for a in cluster2_agents.procs)  # the agents keep serving


def test_a_frozen_host_is_lost_within_the_bound_and_does_not_come_back(
    cluster2: netns.Cluster, cluster2_agents: ClusterAgents
) -> None:
    frozen: list[int] = []
    result, detected, gone = lose_host_1(
        cluster2, cluster2_agents, lambda agent, session: frozen.extend(freeze(agent))
    )
    try:
        assert_host_1_lost(result, cluster2_agents.addresses, bound=True)
        assert BOUND_S / 2 < detected < BOUND_S + SLACK_S, (
            detected
        )  # (the last answer was up to a fifth before)
        assert running(gone) == gone  # still there, stopped
    finally:
        for pid in running(frozen):
            os.kill(pid, signal.SIGCONT)
    # Resumed, the agent reads that the client closed its connection: session and procs exit.
    assert wait_gone(gone) == []
    assert cluster2_agents.procs[1].poll() is None


def test_a_cut_link_is_a_lost_host_within_the_bound_and_its_procs_exit(
    cluster2: netns.Cluster, cluster2_agents: ClusterAgents
) -> None:
    host = cluster2.hosts[1]

    def cut(agent: int, session: int) -> None:
        subprocess.run(["ip", "-n", host.netns, "link", "set", "eth0", "down"], check=True, timeout=30)

    try:
        result, detected, gone = lose_host_1(cluster2, cluster2_agents, cut)
        assert_host_1_lost(result, cluster2_agents.addresses, bound=True)
        assert BOUND_S / 2 < detected < BOUND_S + SLACK_S, (
            detected
        )  # (the last answer was up to a fifth before)
        # Its session stops hearing the client too: it kills the client's procs there and exits.
        assert wait_gone(gone, timeout=BOUND_S + 5) == []
        assert cluster2_agents.procs[1].poll() is None
    finally:
        subprocess.run(["ip", "-n", host.netns, "link", "set", "eth0", "up"], check=True, timeout=30)


def test_a_host_busy_spawning_still_answers_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its session waits longer than the bound for a template importing a slow preload: the
    heartbeat is answered beside that, and the host is not taken for lost."""
    from actors import Pid

    from monarch.actor import hosts_from_config
    from monarch.config import configured

    monkeypatch.setenv("SLOW_IMPORT_S", "2.5")
    monkeypatch.setenv("MONARCH_TEST_HOSTS", "local:1")
    with configured(host_heartbeat_timeout_s=1):
        hosts = hosts_from_config("MONARCH_TEST_HOSTS")
        try:
            procs = hosts.spawn_procs(per_host={"gpus": 1}, preload=["slow_import"])
            assert procs.spawn("pid", Pid).pid.call_one().get(timeout=30) > 0
        finally:
            hosts.shutdown().get(timeout=30)
