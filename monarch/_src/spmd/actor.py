"""``SPMDActor`` and ``setup_torch_elastic_env``: a ProcMesh made to look like a torchrun job.

Code written for torchrun reads who it is from the environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` ...), and ``torch.distributed.init_process_group()`` rendezvouses through it.
An actor mesh knows the same things from its shape, so one small actor per proc writes them
into its process's environment; every actor spawned there afterwards (and a script run by
``SPMDActor.main``) sees a torchrun-style rank. Monarch's conventions: the **last** dimension
of the mesh is the node-local one (``LOCAL_RANK``), the rank is the row-major position in the
whole mesh, and the master is the proc at all-zero coordinates, on a free port of its host.
"""

from __future__ import annotations

import math
import os
import runpy
import socket
import sys
from typing import Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.context import current_rank
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.proc_mesh import ProcMesh

#: Monarch's ``use_ipaddr`` argument: ``socket.AF_INET`` or ``socket.AF_INET6`` to advertise
#: the master by an IP address of that family instead of by host name.
AddrType = socket.AddressFamily

#: The name the helper actor is spawned under (Monarch's).
ACTOR_NAME = "_SPMDActor"


class SPMDActor(Actor):
    """Sets its process up as one torchrun rank; can run a whole script there (``main``)."""

    def __init__(self) -> None:
        point = current_rank()
        sizes = dict(point.extent)
        local_dim = list(sizes)[-1]
        self.rank = point.rank
        self.local_rank = point[local_dim]
        self.local_world_size = sizes[local_dim]
        self.world_size = math.prod(sizes.values())
        self.group_rank = self.rank // self.local_world_size
        self.group_world_size = -(-self.world_size // self.local_world_size)

    @endpoint
    def get_host_port(self, use_ipaddr: AddrType | None = None) -> tuple[str, int]:
        """Where the others can reach this proc's host, and a port free there right now."""
        host = socket.gethostname()
        if use_ipaddr is not None:
            host = str(socket.getaddrinfo(host, None, use_ipaddr, socket.SOCK_STREAM)[0][4][0])
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        return host, port

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set this process's torch elastic variables, as torchrun would for this rank."""
        os.environ.update(
            {
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(self.rank),
                "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size),
                "GROUP_RANK": str(self.group_rank),
                "GROUP_WORLD_SIZE": str(self.group_world_size),
                "ROLE_RANK": str(self.rank),
                "ROLE_WORLD_SIZE": str(self.world_size),
                "ROLE_NAME": "rank",
                "WORLD_SIZE": str(self.world_size),
            }
        )

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Run a torchrun script (``[path, *args]``) or module (``["-m", module, *args]``) in
        this process as ``__main__``, with this rank's environment; its exception is the
        caller's ``ActorError``."""
        if not script_args:
            raise ValueError(
                "No script or module specified\nHINT: pass [path, *args] or ['-m', module, *args]."
            )
        self.setup_env(master_addr, master_port)
        try:
            if script_args[0] == "-m":
                if len(script_args) < 2:
                    raise ValueError("No script or module specified\nHINT: '-m' takes a module name.")
                module = script_args[1]
                sys.argv = [module, *script_args[2:]]
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(script_args)
                runpy.run_path(script_args[0], run_name="__main__")
        except SystemExit as e:
            # A script's sys.exit() ends the script, not the actor's process.
            if e.code not in (None, 0):
                raise RuntimeError(f"{' '.join(script_args)} exited with {e.code!r}") from None
        return True


def _spawn(proc_mesh: ProcMesh, master_addr: str | None, master_port: int | None) -> Any:
    if (master_addr is None) != (master_port is None):
        raise ValueError(
            f"give both master_addr and master_port, or neither (got master_addr={master_addr!r}, "
            f"master_port={master_port!r})\nHINT: with neither, the proc at all-zero coordinates "
            "is the master, on a free port of its host."
        )
    return proc_mesh.spawn(ACTOR_NAME, SPMDActor)


def _origin(actors: Any) -> Any:
    """The actor at all-zero coordinates: the master, like torchrun's rank 0."""
    return actors.slice(**{label: 0 for label in actors.extent.labels})


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """Give every proc of ``proc_mesh`` torchrun's environment for its rank, so that actors
    spawned there afterwards can call ``torch.distributed.init_process_group()``."""
    actors = _spawn(proc_mesh, master_addr, master_port)
    if master_addr is None or master_port is None:
        master_addr, master_port = _origin(actors).get_host_port.call_one(use_ipaddr).get()
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """``setup_torch_elastic_env`` for ``async`` code: awaits instead of blocking."""
    actors = _spawn(proc_mesh, master_addr, master_port)
    if master_addr is None or master_port is None:
        master_addr, master_port = await _origin(actors).get_host_port.call_one(use_ipaddr)
    await actors.setup_env.call(master_addr, master_port)
