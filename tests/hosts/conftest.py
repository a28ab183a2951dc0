"""Fixtures of the many-hosts tests: clusters of network namespaces on this machine (``netns``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import netns
import pytest
from helpers import REPO, TESTS, wait_until
from tcp_helpers import ClusterAgents, make_certs


@pytest.fixture(scope="session")
def netns_ready() -> None:
    """Skip where this machine cannot build a cluster (probed once per session); else remove
    the leftovers of earlier runs that were killed before their teardown."""
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    netns.remove_stale()


@pytest.fixture
def cluster2(netns_ready: None) -> Iterator[netns.Cluster]:
    """Two hosts in network namespaces on one bridge, removed after the test."""
    with netns.Cluster(2) as cluster:
        yield cluster


@pytest.fixture
def hosts2(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[object]:
    """A ``{"hosts": 2}`` mesh of two host agents on this machine (``local:2``), shut down after
    the test (every proc spawned on it, the agents' sessions, the agents themselves). A module
    that counts the frames the client sends turns the heartbeat to the hosts off
    (``HOST_HEARTBEAT = False``): its pings, one per host a second, would be counted too."""
    from monarch.actor import hosts_from_config
    from monarch.config import configured

    monkeypatch.setenv("MONARCH_TEST_HOSTS", "local:2")
    heartbeat = {} if getattr(request.module, "HOST_HEARTBEAT", True) else {"host_heartbeat_timeout_s": 0}
    with configured(**heartbeat):
        hosts = hosts_from_config("MONARCH_TEST_HOSTS")
        yield hosts
        try:
            hosts.shutdown().get(timeout=30)
        except RuntimeError as e:  # the test shut it down itself
            assert "already been shut down" in str(e)


class Agent:
    """A host agent started by hand, as an operator would: its process, address, secret file."""

    def __init__(self, proc: subprocess.Popen[str], address: str, secret_file: str) -> None:
        self.proc = proc
        self.address = address
        self.secret_file = secret_file

    def stderr_after_exit(self) -> str:
        """Stop the agent (SIGTERM) and return what it logged."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=10)
        return err


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    """``python -m monarch.host`` listening on a socket in ``tmp_path``, its secret in a file;
    its procs can import the tests' modules (``actors``). Stopped after the test."""
    secret = tmp_path / "secret"
    secret.write_text("s3cret-for-the-test\n")
    secret.chmod(0o600)
    path = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "monarch.host", "--listen", f"unix:{path}", "--secret-file", str(secret)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(TESTS)),
    )
    wait_until(lambda: path.exists() or proc.poll() is not None, what="the agent's socket")
    yield Agent(proc, f"unix:{path}", str(secret))
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=10)


@pytest.fixture
def cluster2_agents(cluster2: netns.Cluster, tmp_path: Path) -> Iterator[ClusterAgents]:
    """An agent on each host of ``cluster2``, sharing a secret file; they go with the cluster
    (a test that stopped one with SIGSTOP has it continued first, so that it can be killed)."""
    secret = tmp_path / "cluster-secret"
    secret.write_text("cluster-secret")
    secret.chmod(0o600)
    agents = ClusterAgents(cluster2, str(secret))
    yield agents
    for agent in agents.procs:
        if agent.poll() is None:
            agent.send_signal(signal.SIGCONT)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """TLS files made for the test (see ``tcp_helpers.make_certs``)."""
    return make_certs(tmp_path_factory.mktemp("certs"))
