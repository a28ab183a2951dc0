"""A DDP training (gloo, CPU) launched on 2 nodes x 2 ranks ends with the same loss as on
1 node x 4 ranks: the multi-node launch gives the job the same ranks and a working store."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_helpers import Scripts, free_port
from multinode_helpers import DDP_PRELOAD, DDP_TRAIN, launcher, run_nodes

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_ddp_on_two_nodes_ends_with_the_loss_of_one_node(
    scripts: Scripts, tmp_path: Path, one_node_ddp_loss: float
) -> None:
    script = scripts.write("train.py", DDP_TRAIN)
    two_nodes = tmp_path / "2x2"

    endpoint = f"127.0.0.1:{free_port()}"
    argv = launcher("monarch") + [
        *DDP_PRELOAD, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "ddp", script, str(two_nodes),
    ]  # fmt: skip
    runs = run_nodes([argv, argv], timeout=120)
    assert [r.rc for r in runs] == [0, 0], runs

    single, multi = one_node_ddp_loss, float(two_nodes.read_text())
    assert single < 100.0  # it trained (the untrained loss is in the hundreds)
    assert multi == pytest.approx(single, abs=1e-6)
