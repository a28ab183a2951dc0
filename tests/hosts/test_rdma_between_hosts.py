"""RDMABuffer between hosts with network stacks of their own (the namespace cluster), over
TCP: a reader on the other host gets the bytes in chunks served by the owner's runtime (with
the one-time notice), a reader on the owner's host copies them one-sidedly (no notice), and
writes land in the owner's memory. The client runs in the root namespace, at the bridge."""

from __future__ import annotations

import json

import netns
import pytest
from helpers import IMPORT_TEST_MODULES, run_python
from tcp_helpers import ClusterAgents

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import hashlib, json, os, warnings
from actors import Pid
from monarch.actor import endpoint, hosts_from_config
from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning

SIZE = 24 << 20


def digest(data):
    return hashlib.sha256(memoryview(data)).hexdigest()


class Peer(Pid):
    def __init__(self):
        self.data = bytearray(os.urandom(SIZE))
        self.buffer = RDMABuffer(memoryview(self.data))

    @endpoint
    def get_buffer(self):
        return self.buffer

    @endpoint
    def digest(self, end=None):
        return digest(memoryview(self.data)[:end])

    @endpoint
    def read(self, buffer):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always", RDMATcpFallbackWarning)
            dst = bytearray(buffer.size())
            buffer.read_into(memoryview(dst)).get(timeout=60)
        return digest(dst), any(issubclass(w.category, RDMATcpFallbackWarning) for w in seen)

    @endpoint
    def write(self, buffer, data):
        buffer.write_from(memoryview(data)).get(timeout=60)


hosts = hosts_from_config("MONARCH_TEST_HOSTS")
procs = hosts.spawn_procs(per_host={"gpus": 2})
peers = procs.spawn("peers", Peer)
owner = peers.slice(hosts=0, gpus=0)
buf = owner.get_buffer.call_one().get(timeout=60)
expected = owner.digest.call_one().get(timeout=30)
other_host = peers.slice(hosts=1, gpus=0).read.call_one(buf).get(timeout=60)
same_host = peers.slice(hosts=0, gpus=1).read.call_one(buf).get(timeout=60)
dst = bytearray(SIZE)
buf.read_into(memoryview(dst)).get(timeout=60)  # the client: the root namespace, another host
patch = os.urandom(5 << 20)
peers.slice(hosts=1, gpus=1).write.call_one(buf, patch).get(timeout=60)
result = {
    "other_host": list(other_host) == [expected, True],
    "same_host": list(same_host) == [expected, False],
    "client": digest(dst) == expected,
    "written": owner.digest.call_one(len(patch)).get(timeout=30) == digest(patch),
}
print("RESULT " + json.dumps(result), flush=True)
hosts.shutdown().get(timeout=30)
"""
)


def test_reads_and_writes_between_two_network_namespaces(
    cluster2: netns.Cluster, cluster2_agents: ClusterAgents
) -> None:
    env = {
        "MONARCH_TRANSPORT": "tcp",
        "MONARCH_TCP_BIND_HOST": cluster2.bridge_address,
        "MONARCH_TEST_HOSTS": ",".join(cluster2_agents.addresses),
        "MONARCH_HOST_SECRET_FILE": cluster2_agents.secret,
    }
    done = run_python(CLIENT, timeout=100, **env)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout + done.stderr
    result = json.loads(lines[0][len("RESULT ") :])
    assert result == {"other_host": True, "same_host": True, "client": True, "written": True}, done.stderr
