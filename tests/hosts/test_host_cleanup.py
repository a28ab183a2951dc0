"""Teardown of agent hosts: ``shutdown()``, ``async with``, a client killed with -9 (no proc
survives; an agent the client did not start keeps serving the next client), and procs whose
spawning actor died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import psutil
import pytest
from actors import Pid
from helpers import IMPORT_TEST_MODULES, REPO, end_client, running, wait_gone, wait_until

import monarch.actor
from monarch.actor import endpoint, hosts_from_config

pytestmark = pytest.mark.timeout(60)


def _tree(proc_pids: list[int]) -> dict[str, list[int]]:
    """The procs, their sessions (parents) and the agents that started those (grandparents)."""
    sessions = sorted({psutil.Process(p).ppid() for p in proc_pids})
    agents = sorted({psutil.Process(s).ppid() for s in sessions})
    return {"procs": sorted(proc_pids), "sessions": sessions, "agents": agents}


def test_shutdown_stops_procs_sessions_and_local_agents(hosts2: object) -> None:
    procs = hosts2.spawn_procs(per_host={"gpus": 2})
    pids = [pid for _, pid in procs.spawn("pid", Pid).pid.call().get(timeout=20).items()]
    tree = _tree(pids)
    assert len(tree["sessions"]) == 2 and len(tree["agents"]) == 2 and os.getpid() not in tree["agents"]
    hosts2.shutdown().get(timeout=30)
    assert wait_gone(sum(tree.values(), [])) == []
    with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
        hosts2.spawn_procs()
    with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
        hosts2.shutdown()


async def test_async_with_shuts_the_hosts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_TEST_HOSTS", "local:1")
    async with hosts_from_config("MONARCH_TEST_HOSTS") as hosts:
        procs = hosts.spawn_procs()
        pid = await procs.spawn("pid", Pid).pid.call_one()
        tree = _tree([pid])
    assert wait_gone(sum(tree.values(), [])) == []


CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json, sys, threading
from actors import Pid
import monarch.actor
from monarch.actor import endpoint, hosts_from_config
hosts = hosts_from_config("MONARCH_TEST_HOSTS")
procs = hosts.spawn_procs(per_host={"gpus": 2})
pids = procs.spawn("pid", Pid).pid.call().get(timeout=30)
print(json.dumps([pid for _, pid in pids.items()]), flush=True)
threading.Event().wait(60)
"""
)


def _run_and_kill_client(hosts: str, env: dict[str, str] | None = None) -> dict[str, list[int]]:
    """Start a client on ``hosts``, let it spawn 4 procs, kill it with -9; the process tree
    it had (procs, sessions, agents)."""
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, MONARCH_TEST_HOSTS=hosts, **(env or {})),
    )
    tree: dict[str, list[int]] = {"procs": [], "sessions": [], "agents": []}
    try:
        line = client.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the client died early (exit code {client.wait(10)})"
        tree = _tree(json.loads(line))
        client.kill()
        client.wait(10)
        return tree
    finally:
        end_client(client, tree["procs"] + tree["sessions"])


def test_client_killed_9_leaves_no_proc_and_its_local_agents_exit() -> None:
    tree = _run_and_kill_client("local:2")
    assert wait_gone(sum(tree.values(), [])) == []


def test_an_agent_outlives_a_killed_client_and_serves_the_next(agent: Any) -> None:
    env = {"MONARCH_HOST_SECRET_FILE": agent.secret_file}
    first = _run_and_kill_client(f"{agent.address},{agent.address}", env)
    assert first["agents"] == [agent.proc.pid] and len(first["sessions"]) == 2
    assert wait_gone(first["procs"] + first["sessions"]) == []
    assert running([agent.proc.pid]) == [agent.proc.pid]
    second = _run_and_kill_client(agent.address, env)
    assert second["agents"] == [agent.proc.pid]
    assert wait_gone(second["procs"] + second["sessions"]) == []


class Parent(Pid):
    """Spawns a proc on the hosts it is given, and keeps it."""

    @endpoint
    def spawn_child(self, hosts: Any) -> int:
        self.child = hosts.spawn_procs()
        return self.child.spawn("child", Pid).pid.call_one().get(timeout=20)


def test_procs_spawned_by_an_actor_go_when_its_process_dies(
    hosts2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults: list[object] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    procs = hosts2.slice(hosts=0).spawn_procs()
    parent = procs.spawn("parent", Parent)
    child = parent.spawn_child.call_one(hosts2.slice(hosts=1)).get(timeout=30)
    os.kill(parent.pid.call_one().get(timeout=20), signal.SIGKILL)
    assert wait_gone([child]) == []  # its spawner on host 1 killed it
    procs.stop().get(timeout=20)
    wait_until(lambda: faults, 20, "the parent's failure reported to the client")
    assert [f.mesh_name for f in faults] == ["parent"]
