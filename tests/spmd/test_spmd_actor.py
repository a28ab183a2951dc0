"""``monarch.spmd``: a ProcMesh set up as a torchrun job runs torch.distributed in its endpoints."""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Iterator

import pytest

from monarch.actor import Actor, ActorError, HostMesh, ProcMesh, endpoint, hosts_from_config, this_host
from monarch.spmd import SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async

pytestmark = pytest.mark.timeout(120)

#: The meshes that run torch.distributed fork their procs from a template that imported torch
#: once: what is tested is the set-up of the environment, not how torch got imported.
TORCH = ["torch"]

TORCH_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "WORLD_SIZE",
)


class Worker(Actor):
    """An ordinary actor spawned after the set-up: it relies on the environment alone."""

    @endpoint
    def env(self) -> dict[str, str]:
        return {k: os.environ[k] for k in TORCH_VARS}

    @endpoint
    def all_reduce(self) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        try:
            t = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(t)
            return float(t.item())
        finally:
            dist.destroy_process_group()


def expected_env(rank: int, hosts: int, gpus: int) -> dict[str, str]:
    world = hosts * gpus
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % gpus),
        "LOCAL_WORLD_SIZE": str(gpus),
        "GROUP_RANK": str(rank // gpus),
        "GROUP_WORLD_SIZE": str(hosts),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "rank",
        "WORLD_SIZE": str(world),
    }


def check_mesh(procs: ProcMesh, hosts: int, gpus: int) -> None:
    workers = procs.spawn("workers", Worker)
    envs = workers.env.call().get()
    masters = set()
    for point, env in envs.items():
        assert {k: v for k, v in env.items() if not k.startswith("MASTER_")} == expected_env(
            point.rank, hosts, gpus
        )
        masters.add((env["MASTER_ADDR"], env["MASTER_PORT"]))
    ((addr, port),) = masters  # one master for all: the proc at all-zero coordinates, its host
    assert addr == socket.gethostname() and 0 < int(port) < 65536
    world = hosts * gpus
    sums = workers.all_reduce.call().get()
    assert [v for _, v in sums.items()] == [world * (world + 1) / 2] * world


@pytest.fixture
def two_hosts() -> Iterator[HostMesh]:
    os.environ["SPMD_TEST_HOSTS"] = "local:2"
    hosts = hosts_from_config("SPMD_TEST_HOSTS")
    try:
        yield hosts
    finally:
        hosts.shutdown().get()


@pytest.mark.slow
def test_one_host_mesh_runs_gloo_all_reduce() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 3}, preload=TORCH)
    try:
        setup_torch_elastic_env(procs)
        check_mesh(procs, hosts=1, gpus=3)
    finally:
        procs.stop().get()


@pytest.mark.slow
def test_two_agent_hosts_rank_like_two_nodes(two_hosts: HostMesh) -> None:
    procs = two_hosts.spawn_procs(per_host={"gpus": 2}, preload=TORCH)
    setup_torch_elastic_env(procs)
    check_mesh(procs, hosts=2, gpus=2)


async def _setup_async(procs: ProcMesh) -> None:
    await setup_torch_elastic_env_async(procs, "127.0.0.1", 29999)


def test_async_twin_and_explicit_master() -> None:
    import asyncio

    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 1})
    try:
        asyncio.run(_setup_async(procs))
        envs = procs.spawn("workers", Worker).env.call().get()
        assert [
            (e["MASTER_ADDR"], e["MASTER_PORT"], e["RANK"], e["GROUP_RANK"]) for _, e in envs.items()
        ] == [
            ("127.0.0.1", "29999", "0", "0"),
            ("127.0.0.1", "29999", "1", "1"),
        ]
    finally:
        procs.stop().get()


def test_master_addr_without_port_is_refused() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        with pytest.raises(ValueError, match="both master_addr and master_port"):
            setup_torch_elastic_env(procs, master_addr="127.0.0.1")
    finally:
        procs.stop().get()


SCRIPT = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as f:
    f.write(f"{t.item()} {os.environ['WORLD_SIZE']} {sys.argv[0]}")
dist.destroy_process_group()
if sys.argv[2:] == ["fail"]:
    raise RuntimeError("the script failed on purpose")
sys.exit(3 if sys.argv[2:] == ["exit3"] else 0)  # sys.exit(0) ends the script, not the actor
"""


@pytest.mark.slow
def test_main_runs_a_script_per_rank(tmp_path: os.PathLike[str]) -> None:
    script = os.path.join(tmp_path, "train.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    procs = this_host().spawn_procs(per_host={"gpus": 2}, preload=TORCH)
    try:
        actors = procs.spawn("spmd", SPMDActor)
        host, port = actors.slice(gpus=0).get_host_port.call_one().get()
        assert [v for _, v in actors.main.call(host, port, [script, str(tmp_path)]).get().items()] == [
            True,
            True,
        ]
        for rank in (0, 1):
            with open(os.path.join(tmp_path, f"rank{rank}")) as f:
                assert f.read() == f"1.0 2 {script}"
        with pytest.raises(ActorError, match="failed on purpose"):
            actors.main.call(host, port, [script, str(tmp_path), "fail"]).get()
        with pytest.raises(ActorError, match="exited with 3"):
            actors.main.call(host, port, [script, str(tmp_path), "exit3"]).get()
        with pytest.raises(ActorError, match="No script or module specified"):
            actors.main.call(host, port, []).get()
    finally:
        procs.stop().get()
