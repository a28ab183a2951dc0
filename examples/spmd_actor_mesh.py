"""From an actor mesh to SPMD: a ProcMesh set up as a torchrun job with ``monarch.spmd``.

``setup_torch_elastic_env(procs)`` gives every proc torchrun's variables for its place in the
mesh (``RANK`` row-major, ``LOCAL_RANK`` along the last dimension, master: the proc at
all-zero coordinates), so any actor spawned there afterwards can call
``init_process_group()`` with no arguments. Two ways to use it, both shown:

1. your own actor runs the training loop in an endpoint (``Trainer.train``) and returns the
   loss to this controller;
2. ``SPMDActor.main`` runs an unchanged torchrun script (``examples/train_ddp.py``) in every
   proc, as torchrun would.

    python examples/spmd_actor_mesh.py                 # 2 procs on this machine
    python examples/spmd_actor_mesh.py --hosts 2       # 2 local host agents x 2 procs

Both print the same final loss as ``torchrun --nproc-per-node N examples/train_ddp.py``.
"""

from __future__ import annotations

import argparse
import os

from monarch.actor import Actor, ProcMesh, endpoint, hosts_from_config, this_host
from monarch.spmd import SPMDActor, setup_torch_elastic_env

TRAIN_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_ddp.py")


class Trainer(Actor):
    """One rank: torch.distributed finds everything it needs in the environment."""

    @endpoint
    def train(self, epochs: int, steps: int) -> float:
        import torch.distributed as dist
        from train_ddp import fit  # the loop examples/train_ddp.py runs under a launcher

        dist.init_process_group("gloo")
        try:
            return fit(epochs, steps)
        finally:
            dist.destroy_process_group()


def spawn_procs(hosts: int, nproc: int) -> ProcMesh:
    if hosts == 1:
        return this_host().spawn_procs(per_host={"gpus": nproc})
    os.environ.setdefault("SPMD_EXAMPLE_HOSTS", f"local:{hosts}")
    return hosts_from_config("SPMD_EXAMPLE_HOSTS").spawn_procs(per_host={"gpus": nproc})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--nproc", type=int, default=2, help="procs per host")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    procs = spawn_procs(args.hosts, args.nproc)
    world = args.hosts * args.nproc

    # 1. Your actor, your loop: results come back to the controller.
    setup_torch_elastic_env(procs)
    losses = procs.spawn("trainers", Trainer).train.call(args.epochs, args.steps).get()
    print(
        f"[controller] Trainer.train: final loss {losses.item(**{label: 0 for label in losses.extent.labels}):.6f} "
        f"(world size {world})",
        flush=True,
    )

    # 2. A whole torchrun script, unchanged, in every proc (it prints its own final loss).
    spmd = procs.spawn("spmd", SPMDActor)
    origin = spmd.slice(**{label: 0 for label in spmd.extent.labels})
    master_addr, master_port = origin.get_host_port.call_one(None).get()
    script = [TRAIN_SCRIPT, "--epochs", str(args.epochs), "--steps", str(args.steps)]
    spmd.main.call(master_addr, master_port, script).get()
    procs.stop().get()


if __name__ == "__main__":
    main()
