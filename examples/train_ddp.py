"""A plain torchrun-style DDP training script (gloo, CPU): runs the same under either launcher.

    python -m monarch.launch --nproc-per-node 2 examples/train_ddp.py
    torchrun               --nproc-per-node 2 examples/train_ddp.py      # same final loss

Every rank trains the same tiny regression model on its own shard of a synthetic data set
(fixed seeds), DDP averages the gradients with gloo, and rank 0 prints the loss per epoch
and the final loss. The script knows nothing about monarch: it reads ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` through ``init_process_group()``'s defaults.

Options: ``--epochs N`` (default 5), ``--steps N`` per epoch (default 20),
``--fail-rank R --fail-attempt A`` (make rank R crash on restart attempt A, to watch
``--max-restarts`` at work).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


def make_data(rank: int, world: int, n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 8, generator=g)
    true_w = torch.arange(1.0, 9.0).unsqueeze(1)
    y = x @ true_w + 0.1 * torch.randn(n, 1, generator=g)
    return x[rank::world], y[rank::world]


def fit(
    epochs: int, steps: int, lr: float = 0.01, on_epoch_end: Callable[[int], None] | None = None
) -> float:
    """The training loop, on the default process group; returns the final averaged loss.

    ``examples/ddp_actor_mesh.py`` calls this same function from an actor endpoint.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = make_data(rank, world)
    batch = max(1, len(x) // steps)
    loss = avg = torch.zeros(())
    for epoch in range(epochs):
        for step in range(steps):
            xb, yb = x[step * batch : (step + 1) * batch], y[step * batch : (step + 1) * batch]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
        if on_epoch_end is not None:
            on_epoch_end(rank)
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        avg /= world
        if rank == 0:
            print(f"epoch {epoch} loss {avg.item():.6f}", flush=True)
    return float(avg.item())


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-attempt", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def fail_on_purpose(rank: int) -> None:
        if rank == args.fail_rank and attempt == args.fail_attempt:
            raise RuntimeError(f"rank {rank} fails on purpose (attempt {attempt})")

    final = fit(args.epochs, args.steps, on_epoch_end=fail_on_purpose)
    if dist.get_rank() == 0:
        print(f"final loss {final:.6f} (world size {dist.get_world_size()}, attempt {attempt})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
