"""``host_mesh_from_store``: every rank of a running 2-node job calls it with the job's store;
global rank 0 gets a HostMesh with one host per node, spawns actors there and calls them; the
other ranks get None; nothing of it outlives the job; the host secret never sits in the store."""

from __future__ import annotations

import json
import socket
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import alive, all_processes, wait_while
from launch_helpers import TORCHRUN, Scripts, _popen, clean_env, free_port
from multinode_helpers import finish, launcher, run_nodes

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: Every rank calls host_mesh_from_store; rank 0 spawns 2 procs per host, asks each which node
#: (the GROUP_RANK its agent inherited) and process it is, and writes it down with the store's
#: keys; every rank writes what it got; a barrier keeps the nodes up while rank 0 works.
SCRIPT = """
import json, os, sys
import torch.distributed as dist
from monarch.actor import Actor, endpoint
from monarch.spmd import host_mesh_from_store

class Where(Actor):
    @endpoint
    def where(self) -> list:
        return [int(os.environ["GROUP_RANK"]), os.getpid()]

out = sys.argv[1]
dist.init_process_group("gloo")
store = dist.distributed_c10d._get_default_store()
transport, port = os.environ.get("BRIDGE_TRANSPORT", "ipc"), int(os.environ.get("BRIDGE_PORT", "0"))
hosts = host_mesh_from_store(store, transport=transport, monarch_port=port)
rank = int(os.environ["RANK"])
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(None if hosts is None else dict(hosts.extent), f)
if hosts is not None:
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    where = [v for _, v in procs.spawn("where", Where).where.call().get().items()]
    nodes = int(os.environ["WORLD_SIZE"]) // int(os.environ["LOCAL_WORLD_SIZE"])
    keys = ["monarch/spmd/client_key"] + [
        f"monarch/spmd/{k}/{g}" for g in range(nodes) for k in ("node_key", "sealed", "workers")
    ]
    stored = {k: store.get(k).decode() for k in keys}
    hosts.shutdown().get()
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"where": where, "store": stored}, f)
dist.barrier()
dist.destroy_process_group()
"""


def ours(mark: str) -> list[psutil.Process]:
    """Processes of this test's job still running (they carry its marker in their environment)."""
    found = []
    for p in all_processes():
        try:
            if p.environ().get("SPMD_TEST_MARK") == mark:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return alive(found)


@pytest.mark.parametrize(("tool", "nproc"), [("monarch", 2), ("torchrun", 1)])
def test_rank0_gets_a_host_mesh_over_both_nodes(
    scripts: Scripts, tmp_path: Path, tool: str, nproc: int
) -> None:
    if tool == "torchrun" and TORCHRUN is None:
        pytest.skip("torchrun is not installed in this environment")
    script = scripts.write("bridge.py", SCRIPT)
    mark = uuid.uuid4().hex
    argv = launcher(tool) + [
        "--nnodes", "2", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "bridge", script, str(tmp_path),
    ]  # fmt: skip
    runs = run_nodes([argv, argv], timeout=150, env=clean_env(SPMD_TEST_MARK=mark))
    assert [r.rc for r in runs] == [0, 0], runs

    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2 * nproc)]
    assert got == [{"hosts": 2}] + [None] * (2 * nproc - 1)
    result = json.loads((tmp_path / "result.json").read_text())
    assert [node for node, _ in result["where"]] == [0, 0, 1, 1]  # hosts x gpus, one host per node
    assert len({pid for _, pid in result["where"]}) == 4

    # Nothing outlives the job: no agent, session or spawned proc (all carry the marker).
    assert wait_while(lambda: ours(mark)) == []
    assert not alive(pid for _, pid in result["where"])  # a zombie counts as gone

    # The store holds public keys, the secret only padded, and the agents' addresses.
    stored = result["store"]
    sockets = [Path(stored[f"monarch/spmd/workers/{g}"].removeprefix("unix:")) for g in (0, 1)]
    assert not [s.parent for s in sockets if s.parent.exists()]  # each agent's directory is gone
    assert all(len(bytes.fromhex(stored[f"monarch/spmd/sealed/{g}"])) == 32 for g in (0, 1))
    assert stored["monarch/spmd/sealed/0"] != stored["monarch/spmd/sealed/1"]  # one pad per node
    assert all(stored[f"monarch/spmd/workers/{g}"].startswith("unix:") for g in (0, 1))


def start_tcp_node(
    rank: int, host: str, master: int, port: int, script: str, out: Path, mark: str
) -> subprocess.Popen[str]:
    """One torchrun "node" (static rendezvous) whose ranks listen on ``host``, agent on ``port``."""
    argv = launcher("torchrun") + [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "static", "--node-rank", str(rank),
        "--master-addr", "127.0.0.1", "--master-port", str(master), script, str(out),
    ]  # fmt: skip
    env = clean_env(
        SPMD_TEST_MARK=mark, BRIDGE_TRANSPORT="tcp", BRIDGE_PORT=str(port), MONARCH_TCP_BIND_HOST=host
    )
    return _popen(argv, env, None)


def test_tcp_transport_across_two_addresses(scripts: Scripts, tmp_path: Path) -> None:
    """Two "machines" on 127.0.0.1 and 127.0.0.2, agents on the same fixed port (torchrun:
    a fresh process may still choose its transport)."""
    if TORCHRUN is None:
        pytest.skip("torchrun is not installed in this environment")
    script = scripts.write("bridge.py", SCRIPT)
    mark, port, master = uuid.uuid4().hex, free_port(), free_port()
    nodes = [
        start_tcp_node(r, h, master, port, script, tmp_path, mark)
        for r, h in ((0, "127.0.0.1"), (1, "127.0.0.2"))
    ]
    runs = finish(nodes, timeout=150)
    assert [r.rc for r in runs] == [0, 0], runs
    result = json.loads((tmp_path / "result.json").read_text())
    assert [node for node, _ in result["where"]] == [0, 0, 1, 1]
    workers = sorted(result["store"][f"monarch/spmd/workers/{g}"] for g in (0, 1))
    assert workers == [f"tcp:127.0.0.1:{port}", f"tcp:127.0.0.2:{port}"]
    assert wait_while(lambda: ours(mark)) == []


def test_a_node_that_cannot_start_its_agent_is_named_by_rank_0(scripts: Scripts, tmp_path: Path) -> None:
    """Node 1's port is taken: node 1 fails, and rank 0 fails at once naming node 1 and why
    (instead of waiting for an address that will never come)."""
    if TORCHRUN is None:
        pytest.skip("torchrun is not installed in this environment")
    script = scripts.write("bridge.py", SCRIPT)
    mark, master = uuid.uuid4().hex, free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        port = taken.getsockname()[1]
        nodes = [
            start_tcp_node(r, h, master, port, script, tmp_path, mark)
            for r, h in ((0, "127.0.0.1"), (1, "127.0.0.2"))
        ]
        runs = finish(nodes, timeout=150)
    assert [r.rc != 0 for r in runs] == [True, True], runs
    assert "node 1 could not start its host agent: [Errno 98] Address already in use" in runs[0].err, runs[0]
    assert "could not start the host agent of node 1" in runs[1].err, runs[1]
    assert wait_while(lambda: ours(mark)) == []
