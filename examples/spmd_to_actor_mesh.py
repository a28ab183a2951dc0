"""From SPMD to an actor mesh: a torchrun-style script whose rank 0 takes over every node.

Each rank trains as usual (``fit`` from ``examples/train_ddp.py``), then all ranks call
``host_mesh_from_store`` with the job's store. The local rank 0 of every node starts a host
agent; global rank 0 gets a ``{"hosts": nodes}`` HostMesh over all of them (the others get
None) and becomes the controller of an actor mesh: here it spawns probes on every node and
asks where they run. The other ranks wait at a barrier so that their nodes stay up.

    python -m monarch.launch --nproc-per-node 2 examples/spmd_to_actor_mesh.py
    torchrun --nproc-per-node 2 examples/spmd_to_actor_mesh.py

    # two nodes (run on each; here both on this machine):
    python -m monarch.launch --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:29400 --rdzv-id demo examples/spmd_to_actor_mesh.py

The agents use Unix sockets (``transport="ipc"``, one machine). Across machines, run under
torchrun with ``transport="tcp"`` and ``monarch_port`` (a port free on every node), and
``MONARCH_TCP_BIND_HOST`` set on each node to an address the others reach.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch.distributed as dist
from train_ddp import fit

from monarch.actor import Actor, endpoint
from monarch.spmd import host_mesh_from_store


class Probe(Actor):
    @endpoint
    def where(self) -> str:
        return f"{socket.gethostname()} pid {os.getpid()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    final = fit(args.epochs, args.steps)  # the SPMD part: every rank trains

    hosts = host_mesh_from_store(dist.distributed_c10d._get_default_store())
    if hosts is not None:  # global rank 0: now the controller of an actor mesh over every node
        print(f"[rank 0] final loss {final:.6f}; host mesh {dict(hosts.extent)}", flush=True)
        probes = hosts.spawn_procs(per_host={"gpus": 2}).spawn("probes", Probe)
        for point, where in probes.where.call().get().items():
            print(f"[rank 0] probe hosts={point['hosts']} gpus={point['gpus']}: {where}", flush=True)
        hosts.shutdown().get()
    dist.barrier()  # keep every node (and its host agent) up until rank 0 is done
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
