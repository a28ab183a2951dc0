"""SLURM's variables as the launcher's defaults, for what the command line leaves out.

Two ways to run ``python -m monarch.launch`` in a SLURM job of several nodes, told apart by
whether the launcher runs inside a job step (``SLURM_STEP_ID`` is set):

* **Under srun, one launcher per node** (``srun --ntasks-per-node=1 python -m monarch.launch
  ...``): ``--nnodes`` is the step's node count, ``--node-rank`` its ``SLURM_NODEID``, the
  rendezvous endpoint the first node of ``SLURM_STEP_NODELIST`` at a port derived from the
  job id (or ``--master-port``), and ``--local-addr`` this node's address.
* **In the batch script or an salloc shell, one launcher for every node**: single-controller
  mode on the allocation's nodes, as ``--hosts slurm`` (one host agent per node, started with
  srun), with ``--local-addr`` this machine's address toward the nodes.

Nodes are reached at the address SLURM reaches them at (``NodeAddr``), so node names need not
resolve. Any of ``--nnodes``, ``--node-rank``, ``--rdzv-endpoint``, ``--master-addr``,
``--standalone`` or ``--hosts`` (or their ``PET_*`` variables) means the user set the job's
shape: nothing of it is derived then. A job of one node is left as torchrun would run it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from .config import LaunchConfigError

#: Options that make the job's shape the user's own.
SHAPE_OPTIONS = frozenset({"nnodes", "node_rank", "rdzv_endpoint", "master_addr", "standalone", "hosts"})
#: The derived rendezvous port is PORT_BASE + job id modulo PORT_SPAN: the same on every node
#: of a job, different for jobs that share a node, below Linux's ephemeral ports (32768-).
PORT_BASE = 20000
PORT_SPAN = 10000
SLURM_HOSTS = "slurm"


def rendezvous_port(job_id: str) -> int:
    """The port every node of SLURM job ``job_id`` derives for its rendezvous."""
    return PORT_BASE + int(job_id) % PORT_SPAN


def apply_slurm_defaults(
    namespace: argparse.Namespace, given: set[str], environ: Mapping[str, str]
) -> str | None:
    """Fill in what SLURM's variables say and ``given`` (the options set on the command line
    or by ``PET_*``) leaves out (see the module docstring); returns a notice saying what was
    derived, or None. A SLURM command that fails is a LaunchConfigError."""
    from monarch._src.host import slurm

    try:
        if namespace.hosts == SLURM_HOSTS:
            if "local_addr" not in given:
                namespace.local_addr = _controller_address(environ)
            return None
        job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
        if not job_id or given & SHAPE_OPTIONS:
            return None
        if environ.get("SLURM_STEP_ID") is not None:
            return _one_launcher_per_node(namespace, given, environ, job_id)
        nodes = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
        if nodes < 2:
            return None
        namespace.hosts = SLURM_HOSTS
        if "local_addr" not in given:
            namespace.local_addr = _controller_address(environ)
        return (
            f"inside SLURM job {job_id} of {nodes} nodes, outside any job step: this launcher runs "
            f"the workers of every node (--hosts slurm, --local-addr {namespace.local_addr}); to run "
            "one launcher per node, start it with `srun --ntasks-per-node=1`; --nnodes 1 keeps it on this node"
        )
    except slurm.SlurmError as e:
        raise LaunchConfigError(str(e), torchrun_error=None) from None


def _one_launcher_per_node(
    namespace: argparse.Namespace, given: set[str], environ: Mapping[str, str], job_id: str
) -> str | None:
    from monarch._src.host import slurm

    nodes = int(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
    if nodes < 2:
        return None
    tasks = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or nodes)
    step = f"{job_id}.{environ['SLURM_STEP_ID']}"
    if tasks != nodes:
        raise LaunchConfigError(
            f"SLURM step {step} runs {tasks} tasks on {nodes} nodes, but monarch.launch runs one "
            "launcher per node, which starts that node's workers",
            torchrun_error=None,
            hint="srun --ntasks-per-node=1 python -m monarch.launch --nproc-per-node=N ... "
            "(or pass --nnodes, --node-rank and the rendezvous yourself)",
        )
    names = slurm.expand_hostlist(
        environ.get("SLURM_STEP_NODELIST") or environ["SLURM_JOB_NODELIST"], environ
    )
    here = environ.get("SLURMD_NODENAME", names[int(environ.get("SLURM_NODEID", 0))])
    addresses = slurm.node_addresses(sorted({names[0], here}), environ)
    port = namespace.master_port if "master_port" in given else rendezvous_port(job_id)
    namespace.nnodes = str(nodes)
    derived = [f"--nnodes={nodes}"]
    if namespace.rdzv_backend == "static":  # node 0 hosts the store at the master address
        namespace.node_rank = int(environ.get("SLURM_NODEID", 0))
        namespace.master_addr, namespace.master_port = addresses[names[0]], port
        derived += [f"--node-rank={namespace.node_rank}", f"--master-addr={namespace.master_addr}"]
        derived.append(f"--master-port={port}")
    else:
        namespace.rdzv_endpoint = f"{_host(addresses[names[0]])}:{port}"
        derived.append(f"--rdzv-endpoint={namespace.rdzv_endpoint}")
    if "local_addr" not in given:
        namespace.local_addr = addresses[here]
        derived.append(f"--local-addr={namespace.local_addr}")
    return f"SLURM step {step}: {' '.join(derived)} (give --nnodes, --node-rank or the rendezvous to set them yourself)"


def _controller_address(environ: Mapping[str, str]) -> str:
    """This machine's address toward the allocation's first node: where the launcher
    listens for the nodes' agents and hosts the workers' store."""
    from monarch._src.host import slurm
    from monarch._src.transport.address import address_toward

    first = slurm.allocation(environ).nodes[0]
    return address_toward(slurm.node_addresses([first], environ)[first])


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def listen_for_nodes(local_addr: str | None, environ: Mapping[str, str]) -> None:
    """With ``--hosts slurm``, unless the environment says how the launcher listens: on TCP
    at ``local_addr``, where the nodes' agents and workers reach it."""
    from monarch._src.runtime.config import configure

    settings = {}
    if "MONARCH_TRANSPORT" not in environ:
        settings["transport"] = "tcp"
    if "MONARCH_TCP_BIND_HOST" not in environ and local_addr:
        settings["tcp_bind_host"] = local_addr
    configure(**settings)
