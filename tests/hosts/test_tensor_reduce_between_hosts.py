"""Reductions of distributed tensors on a mesh spanning two hosts (network namespaces, each with
a host agent): the procs reach the client's rendezvous store at its address on the bridge, and
gloo talks on each proc's own address, not on whatever the shared host name resolves to."""

from __future__ import annotations

import json

import netns
import pytest
from helpers import IMPORT_TEST_MODULES, run_python
from tcp_helpers import ClusterAgents

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import json
import torch
import monarch
from monarch.actor import hosts_from_config

hosts = hosts_from_config("MONARCH_TEST_HOSTS")
procs = hosts.spawn_procs(per_host={"gpus": 2})
with procs.activate():
    r = procs.rank_tensor(["hosts", "gpus"])  # 0..3, row-major
    x = (r + 1).to(torch.float32) * torch.ones(2)  # 1..4
    across_hosts = x.reduce("hosts", "sum")  # subgroups {0, 2} and {1, 3}, each spanning both hosts
    everything = x.reduce(["hosts", "gpus"], "sum")
result = {
    f"{h}{g}": [monarch.inspect(t, hosts=h, gpus=g).tolist() for t in (across_hosts, everything)]
    for h in (0, 1)
    for g in (0, 1)
}
print("RESULT " + json.dumps(result), flush=True)
hosts.shutdown().get(timeout=30)
"""
)


def test_sum_reduction_over_a_mesh_on_two_hosts(
    cluster2: netns.Cluster, cluster2_agents: ClusterAgents
) -> None:
    done = run_python(
        CLIENT,
        timeout=120,
        MONARCH_TRANSPORT="tcp",
        MONARCH_TCP_BIND_HOST=cluster2.bridge_address,
        MONARCH_TEST_HOSTS=",".join(cluster2_agents.addresses),
        MONARCH_HOST_SECRET_FILE=cluster2_agents.secret,
    )
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line[len("RESULT ") :]) == {
        "00": [[4.0, 4.0], [10.0, 10.0]],
        "01": [[6.0, 6.0], [10.0, 10.0]],
        "10": [[4.0, 4.0], [10.0, 10.0]],
        "11": [[6.0, 6.0], [10.0, 10.0]],
    }
