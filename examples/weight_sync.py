"""Weight sync: one trainer, a mesh of inference actors, and RDMABuffers in between.

The trainer registers each parameter once (no copy) and hands out the handles; after every
training step it only tells the inference actors the new version, and each of them pulls the
bytes itself, one-sidedly, while the trainer goes on. The parameters never travel through a
message: only the small handles do.

Run: python examples/weight_sync.py
"""

from __future__ import annotations

import time

import torch

from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMAAction, RDMABuffer

#: A small model's parameters: name -> number of float32 values (about 40 MiB in all).
SHAPES = {"embedding": 4 << 20, "layer.weight": 4 << 20, "layer.bias": 4096, "head": 2 << 20}


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The flat uint8 view that RDMABuffer and read_into take (no copy)."""
    return t.view(torch.uint8).flatten()


class Trainer(Actor):
    def __init__(self) -> None:
        self.params = {name: torch.zeros(n) for name, n in SHAPES.items()}
        # Registered once: the buffers see every in-place update of the parameters.
        self.buffers = {name: RDMABuffer(as_bytes(p)) for name, p in self.params.items()}
        self.version = 0

    @endpoint
    def handles(self) -> dict[str, RDMABuffer]:
        return self.buffers

    @endpoint
    def step(self) -> int:
        """Pretend to train: every parameter moves by one, in place."""
        with torch.no_grad():
            for p in self.params.values():
                p.add_(1.0)
        self.version += 1
        return self.version


class Inference(Actor):
    def __init__(self) -> None:
        self.params = {name: torch.empty(n) for name, n in SHAPES.items()}
        self.version = 0

    @endpoint
    async def sync(self, handles: dict[str, RDMABuffer], version: int) -> None:
        # One batch: every parameter is read concurrently; awaited, so the actor's loop is free.
        action = RDMAAction()
        for name, handle in handles.items():
            action.read_remote(as_bytes(self.params[name]), handle)
        await action.submit(timeout=30)
        self.version = version

    @endpoint
    async def infer(self) -> tuple[int, float]:
        """The weights' version, and what a forward pass would see of them."""
        return self.version, float(sum(p.mean() for p in self.params.values()) / len(self.params))


def main() -> None:
    trainer = this_host().spawn_procs(per_host={"gpus": 1}).spawn("trainer", Trainer)
    # preload: the replicas are forked from a template that imported torch once, not 3 times
    inference = (
        this_host().spawn_procs(per_host={"replicas": 3}, preload=["torch"]).spawn("inference", Inference)
    )
    handles = trainer.handles.call_one().get()  # small: addresses and ids, not bytes
    total = sum(h.size() for h in handles.values())
    for _ in range(3):
        version = trainer.step.call_one().get()
        start = time.perf_counter()
        inference.sync.call(handles, version).get()
        elapsed = time.perf_counter() - start
        seen = {v for _, v in inference.infer.call().get()}
        print(
            f"version {version}: 3 replicas pulled {total / 2**20:.0f} MiB each in {elapsed * 1e3:.0f} ms; "
            f"they see {sorted(seen)}"
        )
        assert seen == {(version, float(version))}, seen


if __name__ == "__main__":
    main()
