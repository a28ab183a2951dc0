"""The next step after ``python -m monarch.launch``: the same DDP training as an actor mesh.

``examples/train_ddp.py`` is a script that a launcher starts N times. Here its training
loop (``train_ddp.fit``, imported from the script next to this one) runs in an endpoint, ``Trainer.train(cfg)``, of an actor spawned on every process of a
ProcMesh, and this file is the controller: it calls ``trainers.train.call(cfg)`` on all
ranks at once and gets every rank's final loss back. Because the controller is ordinary
Python holding the mesh, a rank failure is an exception it can catch: it stops the
processes and starts the whole group again, the way ``--max-restarts`` does, except that
the policy is now your code (change the config, skip a bad shard, shrink the job ...).

    python examples/ddp_actor_mesh.py                      # rank 1 fails once, then it trains
    python examples/ddp_actor_mesh.py --crash              # rank 1's process dies instead
    python examples/ddp_actor_mesh.py --fail-attempt -1    # no failure

The loss printed at the end is the same as ``examples/train_ddp.py``'s with the same
``--epochs``/``--steps`` (same model, data, seeds), whichever launcher runs that one.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import monarch.actor
from monarch.actor import Actor, ActorError, SupervisionError, endpoint, this_host


@dataclass
class Config:
    epochs: int = 5
    steps: int = 20
    lr: float = 0.01
    fail_rank: int = 1
    fail_attempt: int = 0
    crash: bool = False


class Trainer(Actor):
    """One rank of the data-parallel job; its environment says who it is."""

    @endpoint
    def train(self, cfg: Config) -> float:
        import datetime

        import torch.distributed as dist
        from train_ddp import fit  # the very loop the torchrun-style script runs

        attempt = int(os.environ["ATTEMPT"])

        def fail_on_purpose(rank: int) -> None:
            if rank == cfg.fail_rank and attempt == cfg.fail_attempt:
                if cfg.crash:
                    os._exit(3)  # the process dies: a supervision event, not an exception
                raise RuntimeError(f"rank {rank} fails on purpose (attempt {attempt})")

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        try:
            return fit(cfg.epochs, cfg.steps, cfg.lr, on_epoch_end=fail_on_purpose)
        finally:
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(nproc: int, port: int, attempt: int) -> Callable[[Any], dict[str, str]]:
    """Each rank's torch.distributed environment, as torchrun would set it."""

    def env(point: Any) -> dict[str, str]:
        return {
            "RANK": str(point.rank),
            "LOCAL_RANK": str(point.rank),
            "WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "ATTEMPT": str(attempt),
            "OMP_NUM_THREADS": "1",
        }

    return env


def train(cfg: Config, nproc: int = 2, max_restarts: int = 2) -> float:
    """The controller: run the mesh, catch a rank failure, restart the group."""
    # A crashed process is reported to whoever owns the mesh: here the client itself. The
    # pending call fails with SupervisionError, which the loop below handles, so the
    # default hook (exit the client) is replaced with a note.
    monarch.actor.unhandled_fault_hook = lambda failure: print(
        f"[controller] {failure.report().splitlines()[0]}"
    )
    for attempt in range(max_restarts + 1):
        env = rank_env(nproc, free_port(), attempt)  # a fresh rendezvous for every attempt
        procs = this_host().spawn_procs(per_host={"gpus": nproc}, env=env)
        trainers = procs.spawn("trainers", Trainer)
        try:
            losses = trainers.train.call(cfg).get()
        except (ActorError, SupervisionError) as e:
            print(f"[controller] attempt {attempt} failed: {str(e).strip().splitlines()[-1]}")
            procs.stop().get()
            continue
        procs.stop().get()
        final = losses.item(gpus=0)
        print(f"final loss {final:.6f} (world size {nproc}, attempt {attempt})")
        return final
    raise SystemExit(f"[controller] giving up after {max_restarts + 1} attempts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--fail-attempt", type=int, default=0)
    parser.add_argument("--crash", action="store_true", help="kill rank's process instead of raising")
    parser.add_argument("--max-restarts", type=int, default=2)
    args = parser.parse_args()
    cfg = Config(
        args.epochs, args.steps, fail_rank=args.fail_rank, fail_attempt=args.fail_attempt, crash=args.crash
    )
    train(cfg, nproc=args.nproc, max_restarts=args.max_restarts)


if __name__ == "__main__":
    main()
