"""``hosts_from_config`` with the value ``slurm`` on the throw-away cluster: inside an
allocation (an ``salloc`` of both nodes, the client in the root namespace listening on TCP at
the bridge), one host agent per node started with srun, a ``{"hosts": 2}`` mesh in node-list
order whose procs run on their own node; the secret on no command line; after the mesh is shut
down, nothing of it is left on either node."""

from __future__ import annotations

import psutil
import pytest
import slurm_cluster
from helpers import IMPORT_TEST_MODULES, alive, wait_until

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]  # a client, two agents and their procs

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json, os, sys
from actors import Where
from monarch.actor import hosts_from_config

hosts = hosts_from_config("MONARCH_TEST_HOSTS")
hosts.initialized.get(timeout=30)
procs = hosts.spawn_procs(per_host={"gpus": 1})
where = procs.spawn("where", Where)
places = where.where.call().get(timeout=30)
result = {
    "extent": dict(procs.extent),
    "places": [[point["hosts"], *place] for point, place in places.items()],
    "pids": list(where.pid.call().get(timeout=30).values()),
}
print("RESULT " + json.dumps(result), flush=True)
sys.stdin.readline()  # the test looks at the running agents meanwhile
hosts.shutdown().get(timeout=30)
print("DONE", flush=True)
"""
)


def test_one_agent_per_node_in_node_list_order(slurm2: slurm_cluster.SlurmCluster) -> None:
    idle = slurm2.node_pids()
    client = slurm2.allocation_client(CLIENT, MONARCH_TEST_HOSTS="slurm")
    try:
        result = slurm_cluster.read_result(client)

        assert result["extent"] == {"hosts": 2, "gpus": 1}
        places = sorted(result["places"])
        # host i of the mesh is node i of SLURM_JOB_NODELIST, and its proc listens there
        assert [(host, hostname) for host, hostname, _ in places] == [(0, "n1"), (1, "n2")]
        for _, name, address in places:
            assert address.startswith(f"tcp:{slurm2.node_host(name).address}:"), places
        agents = [psutil.Process(pid) for pids in slurm2.node_pids().values() for pid in pids]
        commands = [p.cmdline() for p in agents if "monarch._src.host.slurm_hosts" in p.cmdline()]
        assert len(commands) == 2
        assert all(cmd[1:] == ["-m", "monarch._src.host.slurm_hosts"] for cmd in commands), commands

        assert client.stdin is not None
        client.stdin.write("\n")
        client.stdin.flush()
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0 and "DONE" in out, err
        # The agents exited with their client's mesh, the step ended: only slurmd is left.
        wait_until(
            lambda: slurm2.node_pids() == idle,
            15,
            "the nodes to be idle",
        )
        # A zombie counts as gone: the killed agent's orphans are reaped by init (not ours here).
        assert not alive(result["pids"])
    finally:
        if client.poll() is None:
            client.kill()
            client.communicate(timeout=30)
