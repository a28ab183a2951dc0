"""Train a small model on 4 procs, written entirely with distributed tensors, and check that it
matches the same training in one process.

Data parallel: each proc holds the same parameters and a quarter of every batch. The forward
and backward passes (written out, no autograd) run on each proc's shard; a ``sum`` reduction
across the mesh adds the gradients up, and every proc applies the same update. The client only
issues torch calls; the values stay on the procs until it fetches the final parameters.

Run: python examples/dtensor_train.py
"""

from __future__ import annotations

import torch

import monarch
from monarch.actor import ProcMesh, this_host

PROCS = 4
BATCH, IN, HIDDEN, OUT = 64, 8, 16, 2
STEPS, LR = 25, 0.1


def problem(seed: int = 0) -> tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Initial parameters and the batches (inputs, targets) of every step."""
    g = torch.Generator().manual_seed(seed)
    params = {
        "w1": torch.randn(IN, HIDDEN, generator=g) * 0.3,
        "b1": torch.zeros(HIDDEN),
        "w2": torch.randn(HIDDEN, OUT, generator=g) * 0.3,
        "b2": torch.zeros(OUT),
    }
    true_w = torch.randn(IN, OUT, generator=g)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, IN, generator=g)
        batches.append((x, torch.sin(x @ true_w)))
    return params, batches


def step(
    params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, n: int
) -> dict[str, torch.Tensor]:
    """Forward, and backward by hand, of the mean squared error over ``n`` samples in all; ``x``
    and ``y`` may be a shard of them. Returns the gradients of this shard's share of the loss."""
    h_pre = x @ params["w1"] + params["b1"]
    h = torch.relu(h_pre)
    out = h @ params["w2"] + params["b2"]
    d_out = 2 * (out - y) / (n * OUT)
    d_h_pre = (d_out @ params["w2"].T) * (h_pre > 0)
    return {"w1": x.T @ d_h_pre, "b1": d_h_pre.sum(0), "w2": h.T @ d_out, "b2": d_out.sum(0)}


def train_distributed(procs: ProcMesh) -> dict[str, torch.Tensor]:
    """Train on the procs of ``procs`` (one dimension, ``gpus``); the final parameters of proc 0."""
    params, batches = problem()
    shards = len(procs)
    with procs.activate():
        rank = procs.rank_tensor("gpus").reshape(1)  # an index tensor: shapes stay data-independent
        dparams = {k: torch.as_tensor(v) for k, v in params.items()}  # the same on every proc
        for x, y in batches:
            # each proc takes its quarter of the batch (the client's batch travels as a constant)
            x_mine = x.reshape(shards, -1, IN)[rank][0]
            y_mine = y.reshape(shards, -1, OUT)[rank][0]
            grads = step(dparams, x_mine, y_mine, BATCH)
            for k, g in grads.items():
                dparams[k].sub_(LR * g.reduce("gpus", "sum"))
    return monarch.fetch_shard(dparams, gpus=0).get()


def train_local() -> dict[str, torch.Tensor]:
    """The same training in this process, with autograd, on whole batches."""
    params, batches = problem()
    params = {k: v.clone().requires_grad_() for k, v in params.items()}
    for x, y in batches:
        out = torch.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
        loss = ((out - y) ** 2).mean()
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads):
                p.sub_(LR * g)
    return {k: v.detach() for k, v in params.items()}


def main() -> None:
    # preload: torch is imported once, in a template the procs are forked from, not once per proc
    procs = this_host().spawn_procs(per_host={"gpus": PROCS}, preload=["torch"])
    try:
        distributed = train_distributed(procs)
    finally:
        procs.stop().get()
    local = train_local()
    worst = max(float((distributed[k] - local[k]).abs().max()) for k in local)
    print(f"trained {STEPS} steps on {PROCS} procs; largest difference from one process: {worst:.2e}")
    assert worst < 1e-5, worst


if __name__ == "__main__":
    main()
