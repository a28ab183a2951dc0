"""The network-namespace cluster that the many-hosts tests stand on: hosts are separate network
stacks that reach each other over the bridge, and nothing of a cluster outlives it."""

from __future__ import annotations

import signal
import subprocess
import sys

import netns
import pytest
from helpers import IMPORT_TEST_MODULES, running, wait_gone

#: Listens on (argv[1], 0), prints its port, answers one connection with the peer's address.
SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
conn, peer = s.accept()
conn.sendall(f"{conn.recv(16).decode()} from {peer[0]}".encode())
conn.close()
"""
#: Connects to (argv[1], argv[2]) and prints the answer, or the error's name.
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as c:
        c.sendall(b"ping")
        print(c.recv(64).decode())
except OSError as e:
    print(type(e).__name__)
"""


def start_server(cluster: netns.Cluster, host: int, address: str) -> tuple[subprocess.Popen[str], int]:
    server = cluster.popen(host, [sys.executable, "-c", SERVER, address], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def connect(cluster: netns.Cluster, host: int, address: str, port: int) -> str:
    done = cluster.run(
        host,
        [sys.executable, "-c", CLIENT, address, str(port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def test_host_reaches_other_host_at_its_address(cluster2: netns.Cluster) -> None:
    h0, h1 = cluster2.hosts
    assert h0.address != h1.address
    server, port = start_server(cluster2, 0, h0.address)
    assert connect(cluster2, 1, h0.address, port) == f"ping from {h1.address}"
    assert server.wait(timeout=10) == 0


def test_hosts_are_separate_network_stacks(cluster2: netns.Cluster) -> None:
    server, port = start_server(cluster2, 0, "127.0.0.1")
    # Host 1's loopback is its own: nothing listens there on host 0's port.
    assert connect(cluster2, 1, "127.0.0.1", port) == "ConnectionRefusedError"
    # Host 0's loopback is up and its server was listening all along.
    assert connect(cluster2, 0, "127.0.0.1", port) == "ping from 127.0.0.1"
    assert server.wait(timeout=10) == 0


def test_root_namespace_reaches_hosts_at_their_addresses(cluster2: netns.Cluster) -> None:
    """The bridge is in the root namespace (where slurmctld and srun run in the SLURM tests)."""
    server, port = start_server(cluster2, 1, cluster2.hosts[1].address)
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, cluster2.hosts[1].address, str(port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.strip() == f"ping from {cluster2.bridge_address}"
    assert server.wait(timeout=10) == 0


def test_clusters_side_by_side_do_not_collide(cluster2: netns.Cluster) -> None:
    """Two clusters at once (parallel test runs) get their own names and subnets, and a host of
    one has no route to the other."""
    with netns.Cluster(1) as other:
        assert other.bridge_address.rsplit(".", 1)[0] != cluster2.bridge_address.rsplit(".", 1)[0]
        assert other.run_id != cluster2.run_id
        _, port = start_server(cluster2, 0, cluster2.hosts[0].address)
        assert connect(other, 0, cluster2.hosts[0].address, port) == "OSError"


#: Leaves a process in the namespace that is not the popen'd one: a detached grandchild.
DETACHED = "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!"


@pytest.mark.parametrize("failure", [AssertionError, KeyboardInterrupt])
def test_teardown_removes_everything_even_after_a_failure(
    netns_ready: None, failure: type[BaseException]
) -> None:
    with pytest.raises(failure):
        with netns.Cluster(2) as cluster:
            made = netns.names_of(cluster.run_id)
            sleeper = cluster.popen(0, ["sleep", "60"])
            detached = int(
                cluster.run(1, ["sh", "-c", DETACHED], capture_output=True, text=True, timeout=10).stdout
            )
            assert len(made) == 5, made  # 2 namespaces, the bridge, 2 veths
            assert running([sleeper.pid, detached]) == [sleeper.pid, detached]
            raise failure("the test body fails")
    assert netns.names_of(cluster.run_id) == []
    assert sleeper.returncode == -signal.SIGKILL
    assert wait_gone([detached]) == []


def test_remove_stale_removes_only_clusters_of_dead_runs(cluster2: netns.Cluster) -> None:
    """A run killed before its teardown leaves its cluster behind; the next run's stale cleanup
    removes it, and leaves this live run's cluster alone."""
    code = (
        IMPORT_TEST_MODULES
        + "import netns; c = netns.Cluster(1).__enter__(); print(c.run_id, flush=True); input()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as dead:
        assert dead.stdout is not None
        run_id = dead.stdout.readline().strip()
        dead.kill()  # before its teardown: its cluster stays behind
    assert run_id and run_id.startswith(f"{dead.pid}-")
    assert run_id in netns.runs_present()

    netns.remove_stale()  # (a parallel test run's stale cleanup may have got there first)
    assert run_id not in netns.runs_present()
    assert len(netns.names_of(cluster2.run_id)) == 5
