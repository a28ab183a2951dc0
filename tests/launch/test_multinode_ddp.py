"""A DDP training (gloo, CPU) launched on 2 nodes x 2 ranks ends with the same loss as on
1 node x 4 ranks: the multi-node launch gives the job the same ranks and a working store."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_helpers import Scripts, free_port, monarch_launch
from multinode_helpers import launcher, run_nodes

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: Trains a small linear model on rank-strided shards; rank 0 writes the full-data loss.
TRAIN = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1234))
target = data @ torch.arange(8.0).unsqueeze(1) + 1.0
for _ in range(20):
    opt.zero_grad()
    loss = ((model(data[rank::world]) - target[rank::world]) ** 2).mean()
    loss.backward()
    opt.step()
with torch.no_grad():
    final = ((model.module(data) - target) ** 2).mean().item()
if rank == 0:
    with open(sys.argv[1], "w") as fp:
        fp.write(repr(final))
dist.destroy_process_group()
"""


def test_ddp_on_two_nodes_ends_with_the_loss_of_one_node(scripts: Scripts, tmp_path: Path) -> None:
    script = scripts.write("train.py", TRAIN)
    one_node, two_nodes = tmp_path / "1x4", tmp_path / "2x2"

    run = monarch_launch("--nproc-per-node", "4", script, str(one_node), timeout=120)
    assert run.rc == 0, run

    endpoint = f"127.0.0.1:{free_port()}"
    argv = launcher("monarch") + [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "ddp", script, str(two_nodes),
    ]  # fmt: skip
    runs = run_nodes([argv, argv], timeout=120)
    assert [r.rc for r in runs] == [0, 0], runs

    single, multi = float(one_node.read_text()), float(two_nodes.read_text())
    assert single < 100.0  # it trained (the untrained loss is in the hundreds)
    assert multi == pytest.approx(single, abs=1e-6)
