"""The two ``monarch.spmd`` examples run as documented: an actor mesh running SPMD training,
and a launched SPMD job whose rank 0 takes over both nodes as an actor mesh."""

from __future__ import annotations

import re
import shutil
import sys

import pytest
from launch_helpers import REPO, Scripts, free_port, run_cmd
from multinode_helpers import launcher, run_nodes

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def copy_examples(scripts: Scripts, *names: str) -> list[str]:
    return [shutil.copy(REPO / "examples" / name, scripts.root / name) for name in names]


def test_actor_mesh_runs_spmd_training_on_two_hosts(scripts: Scripts) -> None:
    example, _ = copy_examples(scripts, "spmd_actor_mesh.py", "train_ddp.py")
    run = run_cmd(
        [sys.executable, example, "--hosts", "2", "--nproc", "1", "--epochs", "2", "--steps", "10"],
        timeout=150,
    )
    assert run.rc == 0, run
    from_actor = re.findall(r"\[controller\] Trainer.train: final loss (\S+) \(world size 2\)", run.out)
    from_script = re.findall(r"^final loss (\S+) \(world size 2, attempt 0\)", run.out, re.M)
    assert from_actor and from_actor == from_script, run.out  # same training, both ways
    assert float(from_actor[0]) < 100.0  # it trained (it starts in the hundreds)


def test_launched_job_hands_both_nodes_to_rank_0(scripts: Scripts) -> None:
    example, _ = copy_examples(scripts, "spmd_to_actor_mesh.py", "train_ddp.py")
    argv = launcher("monarch") + [
        "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "example", example,
    ]  # fmt: skip
    runs = run_nodes([argv, argv], timeout=150)
    assert [r.rc for r in runs] == [0, 0], runs
    out = "".join(r.out for r in runs)
    assert "host mesh {'hosts': 2}" in out
    probes = re.findall(r"\[rank 0\] probe hosts=(\d) gpus=(\d): \S+ pid \d+", out)
    assert probes == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")], out
