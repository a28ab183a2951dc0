"""Host agents on two hosts with network stacks of their own (the namespace cluster), reached
over TCP: spawn, call and slicing by host, a client with a wrong secret, a client the hosts
cannot reach back, a client killed with -9, mutual TLS. The client runs in the root namespace,
at the cluster's bridge address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import netns
import psutil
import pytest
from helpers import IMPORT_TEST_MODULES, REPO, TESTS, end_client, run_python, running, wait_gone
from tcp_helpers import ClusterAgents, make_certs

pytestmark = pytest.mark.timeout(90)

AGENT_PORT = 4100

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json, os
from actors import Pid
from monarch.actor import attach_to_workers, context, endpoint, hosts_from_config


class Where(Pid):
    @endpoint
    def address(self) -> str:
        return context().actor_instance.proc_id


tls = json.loads(os.environ.get("TEST_TLS", "null"))
if tls:  # Monarch's way: a CA file and this process's certificate with its key
    workers = os.environ["MONARCH_TEST_HOSTS"].split(",")
    hosts = attach_to_workers(ca=tls["ca"], private_key=tls["key"], workers=workers)
else:
    hosts = hosts_from_config("MONARCH_TEST_HOSTS")
try:
    hosts.initialized.get(timeout=30)
except Exception as e:
    print("RESULT " + json.dumps({"error": str(e)}), flush=True)
    raise SystemExit(0)
procs = hosts.spawn_procs(per_host={"gpus": 2})
where = procs.spawn("where", Where)
addresses = where.address.call().get(timeout=30)
host1 = where.slice(hosts=1).address.call().get(timeout=30)
result = {
    "extent": dict(procs.extent),
    "addresses": [[point["hosts"], address] for point, address in addresses.items()],
    "host1": sorted(host1.values()),
}
print("RESULT " + json.dumps(result), flush=True)
hosts.shutdown().get(timeout=30)
"""
)


@pytest.fixture
def agents(cluster2_agents: ClusterAgents) -> tuple[list[str], str]:
    """An agent on each host of the cluster, on its own address; (their addresses, secret file)."""
    return cluster2_agents.addresses, cluster2_agents.secret


def run_client(cluster: netns.Cluster, hosts: list[str], **env: str) -> dict[str, Any]:
    """Run ``CLIENT`` in the root namespace, listening on TCP at the cluster's bridge address."""
    env = {"MONARCH_TRANSPORT": "tcp", "MONARCH_TCP_BIND_HOST": cluster.bridge_address, **env}
    done = run_python(CLIENT, timeout=80, MONARCH_TEST_HOSTS=",".join(hosts), **env)
    assert done.returncode == 0, done.stderr
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert not results or "error" in results[0] or "Traceback" not in done.stderr, done.stderr
    assert results, done.stderr
    return json.loads(results[0][len("RESULT ") :])


def test_spawn_call_and_slice_across_two_network_namespaces(
    cluster2: netns.Cluster, agents: tuple[list[str], str]
) -> None:
    addresses, secret = agents
    result = run_client(cluster2, addresses, MONARCH_HOST_SECRET_FILE=secret)
    assert result["extent"] == {"hosts": 2, "gpus": 2}
    for host, address in result["addresses"]:  # each proc listens on its own host's address
        assert address.startswith(f"tcp:{cluster2.hosts[host].address}:"), result
    assert len({a for _, a in result["addresses"]}) == 4
    assert result["host1"] == sorted(a for h, a in result["addresses"] if h == 1)


def test_a_client_with_a_wrong_secret_is_refused_over_the_network(
    cluster2: netns.Cluster, agents: tuple[list[str], str]
) -> None:
    addresses, _ = agents
    result = run_client(
        cluster2, addresses[:1], MONARCH_HOST_SECRET="wrong", MONARCH_HOST_ATTACH_TIMEOUT_S="1"
    )
    assert "attach failed" in result["error"] and addresses[0] in result["error"], result


def test_a_client_the_hosts_cannot_reach_back_says_what_to_set(
    cluster2: netns.Cluster, agents: tuple[list[str], str]
) -> None:
    addresses, secret = agents
    result = run_client(
        cluster2, addresses[:1], MONARCH_HOST_SECRET_FILE=secret, MONARCH_TCP_BIND_HOST="127.0.0.1"
    )
    assert "cannot connect back" in result["error"] and "MONARCH_TCP_BIND_HOST" in result["error"], result


def _pem(certs: dict[str, str], who: str, folder: Path) -> str:
    """One PEM file with ``who``'s certificate and key (Monarch's ``private_key``)."""
    path = folder / f"{who}-with-key.pem"
    path.write_text(Path(certs[f"{who}.pem"]).read_text() + Path(certs[f"{who}.key"]).read_text())
    return str(path)


@pytest.mark.slow
def test_mutual_tls_with_monarchs_ca_and_private_key(cluster2: netns.Cluster, tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    node, rogue = _pem(certs, "node", tmp_path), _pem(certs, "rogue", tmp_path)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_HOST_SECRET")}
    addresses = []
    for i, host in enumerate(cluster2.hosts):
        address = f"tcp://{host.address}:{AGENT_PORT}"
        code = (
            "from monarch.actor import run_worker_loop_forever\n"
            f"run_worker_loop_forever(ca={certs['ca']!r}, private_key={node!r}, address={address!r})"
        )
        agent = cluster2.popen(
            i,
            [sys.executable, "-c", code],
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**clean, "PYTHONPATH": str(TESTS)},
        )
        line = agent.stderr.readline()  # type: ignore[union-attr]
        assert "listening on tcp:" in line, line
        addresses.append(address)
    tls = json.dumps({"ca": certs["ca"], "key": node})
    result = run_client(
        cluster2,
        addresses,
        TEST_TLS=tls,
        **{k: "" for k in ("MONARCH_HOST_SECRET", "MONARCH_HOST_SECRET_FILE")},
    )
    assert result["extent"] == {"hosts": 2, "gpus": 2}, result
    refused = run_client(
        cluster2,
        addresses[:1],
        TEST_TLS=json.dumps({"ca": certs["ca"], "key": rogue}),
        MONARCH_HOST_ATTACH_TIMEOUT_S="2",
    )
    assert "attach failed" in refused["error"] and addresses[0][len("tcp://") :] in refused["error"], refused


HOLDING_CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json, threading
from actors import Pid
from monarch.actor import hosts_from_config
procs = hosts_from_config("MONARCH_TEST_HOSTS").spawn_procs(per_host={"gpus": 1})
print(json.dumps([pid for _, pid in procs.spawn("pid", Pid).pid.call().get(timeout=30).items()]), flush=True)
threading.Event().wait(60)
"""
)


def test_a_client_killed_9_loses_its_procs_on_every_host_and_the_agents_stay(
    cluster2: netns.Cluster, agents: tuple[list[str], str]
) -> None:
    addresses, secret = agents
    env = {
        **os.environ,
        "MONARCH_TEST_HOSTS": ",".join(addresses),
        "MONARCH_TRANSPORT": "tcp",
        "MONARCH_TCP_BIND_HOST": cluster2.bridge_address,
        "MONARCH_HOST_SECRET_FILE": secret,
    }
    client = subprocess.Popen(
        [sys.executable, "-c", HOLDING_CLIENT], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    pids: list[int] = []
    try:
        line = client.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the client died early (exit code {client.wait(10)})"
        pids = json.loads(line)
        sessions = [psutil.Process(p).ppid() for p in pids]
        agent_pids = sorted({psutil.Process(s).ppid() for s in sessions})
        client.kill()  # its TCP connections to the agents close with it
        client.wait(10)
        assert wait_gone(pids + sessions) == []
        assert len(running(agent_pids)) == 2
    finally:
        end_client(client, pids)
