"""``--nproc-per-node gpu`` on a machine with GPUs: one worker per GPU, each with torchrun's
environment, initialising NCCL and reducing a CUDA tensor; the same output and exit code as
torchrun's on the same script."""

from __future__ import annotations

import pytest
from helpers import requires_cuda
from launch_helpers import Scripts, clean_env, monarch_launch, torchrun

pytestmark = [requires_cuda, pytest.mark.timeout(180)]

NCCL_SCRIPT = """
import os

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
dist.all_reduce(t)
print(f"rank {dist.get_rank()} local {local} world {dist.get_world_size()} "
      f"gpus {torch.cuda.device_count()} sum {t.sum().item()}", flush=True)
dist.destroy_process_group()
"""


def _lines(out: str) -> list[str]:
    return sorted(line.split("]:", 1)[-1].strip() for line in out.splitlines() if "rank " in line)


def test_nproc_per_node_gpu_runs_nccl_like_torchrun(scripts: Scripts) -> None:
    import torch

    script = scripts.write("nccl_allreduce.py", NCCL_SCRIPT)
    env = clean_env()
    ours = monarch_launch("--nproc-per-node", "gpu", script, env=env, timeout=150)
    theirs = torchrun("--nproc-per-node", "gpu", script, env=env, timeout=150)
    assert ours.rc == theirs.rc == 0, (ours, theirs)
    n = torch.cuda.device_count()
    expected = [f"rank {r} local {r} world {n} gpus {n} sum {4.0 * n * (n + 1) / 2}" for r in range(n)]
    assert _lines(ours.out) == _lines(theirs.out) == expected, (ours, theirs)
