"""Helpers of the multi-node launcher tests: several launchers (or torchruns) run side by side,
one per "node", each bounded, their outputs collected."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from launch_helpers import TORCHRUN, Run, _kill_tree, _popen, clean_env

#: Writes the worker's whole environment to <dir>/rank<RANK>.json.
DUMP_ENV = """
import json, os, sys
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as fp:
    json.dump(dict(os.environ), fp)
"""

#: Trains a small linear model on rank-strided shards; rank 0 writes the full-data loss.
DDP_TRAIN = """
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

#: DDP's constructor imports torch._dynamo (seconds of CPU per rank): the DDP tests, which test
#: the launch and not its import path, have the template import it once for all ranks.
DDP_PRELOAD = ["--preload", "torch,torch._dynamo"]


def launcher(tool: str) -> list[str]:
    """The command line prefix of ``tool``: ``"monarch"`` or ``"torchrun"``."""
    if tool == "torchrun":
        assert TORCHRUN is not None
        return [TORCHRUN]
    return [sys.executable, "-m", "monarch.launch"]


def start_nodes(
    commands: Sequence[Sequence[str]], env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """Start one launcher per command (each in its own session, output piped)."""
    return [_popen(list(argv), env if env is not None else clean_env(), None) for argv in commands]


def finish(procs: Sequence[subprocess.Popen[str]], timeout: float) -> list[Run]:
    """Wait for every launcher (all within ``timeout`` seconds), killing the rest at the deadline."""
    start = time.monotonic()
    runs = []
    for proc in procs:
        left = max(0.1, timeout - (time.monotonic() - start))
        try:
            out, err = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            for p in procs:
                _kill_tree(p)
            out, err = proc.communicate()
            raise AssertionError(f"{proc.args} did not finish within {timeout} s\n{out}\n{err}") from None
        runs.append(Run(proc.returncode, out, err, time.monotonic() - start))
    return runs


def run_nodes(
    commands: Sequence[Sequence[str]], timeout: float = 60, env: dict[str, str] | None = None
) -> list[Run]:
    return finish(start_nodes(commands, env), timeout)


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port`` (a launcher hosting a store)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def read_envs(directory: Path, world_size: int) -> list[dict[str, str]]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(world_size)]
