"""``monarch.job.SlurmJob``: host meshes on nodes asked of SLURM from outside an allocation.

``state()`` submits one batch job (``sbatch``) of as many nodes as the meshes need, whose only
step runs one host agent per node (this module, ``python -m monarch._src.host.slurm_job``,
started by ``srun --ntasks-per-node=1``). Each agent listens on its node's address as SLURM
knows it (``NodeAddr``) at ``monarch_port``, so the client finds the agents from the job's node
list alone. The meshes take the nodes in node-list order (``{"hosts": n}`` each, in the order of
``meshes``).

The secret is fresh for each job and reaches the agents through sbatch's environment
(``MONARCH_HOST_SECRET``: SLURM hands the submitting environment to the job, and srun to its
tasks), never a command line or the batch script; each agent takes it out of its environment.
What a later program needs to re-attach (the job id, the spec, the secret and the agents'
addresses) is written to ``cached_path`` as JSON, readable by its owner only; a file that
others can read or write is refused. The same spec re-attaches to the running job instead of
submitting another; a different spec cancels the cached job first (Monarch's rule: an
allocation nobody can use is not left running).

Lifetime: the agents serve any number of clients in turn and outlive each (a client's exit
ends only its own sessions and procs); ``kill()`` cancels the job (``scancel``) and returns
once SLURM has ended it, with every process of the job gone. An agent that dies takes the
step, hence the job, with it (``srun --kill-on-bad-exit``): its client loses that host at
once, and nothing of the job is left on any node.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from monarch._src.host import slurm
from monarch._src.host.host_mesh import HostMesh, attach
from monarch._src.host.job import JobState, JobTrait, shut_down

logger = logging.getLogger("monarch.job.slurm")

#: How long the agents may take to listen once the job runs (a python interpreter per node).
AGENTS_START_TIMEOUT_S = 60.0
#: How long SLURM may take to end a cancelled job: it signals the tasks, then kills what is
#: left after its ``KillWait`` (30 s by default).
KILL_TIMEOUT_S = 90.0
_CACHE_KIND = "monarch.job.SlurmJob"
_CACHE_VERSION = 1


@dataclass
class _Attached:
    """What a running job is to this client: its id, secret and agents (node-list order)."""

    job_id: str
    secret: str
    addresses: list[str]


class SlurmJob(JobTrait):
    """``meshes={"trainers": 2, ...}``: that many SLURM nodes per name, one ``{"hosts": n}``
    HostMesh each, asked for with ``sbatch`` (see the module docstring). ``kill()`` cancels
    the job and returns once SLURM has ended it; the cached state goes with it.

    The client must listen where the nodes reach it: ``MONARCH_TRANSPORT=tcp`` (or
    ``enable_transport("tcp")``) and ``MONARCH_TCP_BIND_HOST`` set to an address of this
    machine on the cluster's network."""

    def __init__(
        self,
        meshes: Mapping[str, int],
        python_exe: str = sys.executable,
        slurm_args: Sequence[str] = (),
        monarch_port: int = 22222,
        job_name: str = "monarch_job",
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: float | None = None,
        account: str | None = None,
        qos: str | None = None,
    ) -> None:
        super().__init__()
        for name, count in meshes.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(
                    f"SlurmJob: meshes[{name!r}] must be a positive number of nodes, got {count!r}"
                )
        if not meshes:
            raise ValueError('SlurmJob: meshes is empty\nHINT: name at least one mesh, e.g. {"trainers": 2}')
        if isinstance(slurm_args, str):
            raise TypeError(
                f"SlurmJob: slurm_args takes a list of sbatch options, got the string {slurm_args!r}\n"
                f"HINT: slurm_args={shlex.split(slurm_args)!r}"
            )
        if not 0 < monarch_port < 65536:
            raise ValueError(f"SlurmJob: monarch_port must be a TCP port (1-65535), got {monarch_port}")
        #: Everything that decides what is asked of SLURM: a cached job runs a spec equal to it.
        self._spec: dict[str, Any] = {
            "meshes": dict(meshes),
            "python_exe": python_exe,
            "slurm_args": list(slurm_args),
            "monarch_port": monarch_port,
            "job_name": job_name,
            "time_limit": time_limit,
            "partition": partition,
            "log_dir": log_dir,
            "exclusive": exclusive,
            "gpus_per_node": gpus_per_node,
            "cpus_per_task": cpus_per_task,
            "mem": mem,
            "account": account,
            "qos": qos,
        }
        self._job_start_timeout = job_start_timeout
        self._attached: _Attached | None = None
        self._cached_path: str | None = None

    @property
    def job_id(self) -> str | None:
        """The SLURM job this object submitted or re-attached to (None before ``state()``)."""
        return None if self._attached is None else self._attached.job_id

    # ---- JobTrait

    def _create(self, cached_path: str | None) -> dict[str, HostMesh]:
        self._cached_path = cached_path
        attached = self._from_cache(cached_path) if cached_path else None
        _check_reachable_client()
        if attached is None:
            attached = self._submit()
        self._attached = attached
        meshes, first = {}, 0
        for name, count in self._spec["meshes"].items():
            agents = attached.addresses[first : first + count]
            meshes[name] = attach(agents, attached.secret.encode(), name)
            first += count
        return meshes

    def _release(self, state: JobState) -> None:
        try:
            shut_down(state, timeout=10.0)
        finally:
            self._cancel()

    # ---- submitting and re-attaching

    def _submit(self) -> _Attached:
        from monarch._src.host.slurm_hosts import agents_environment

        secret = os.urandom(32).hex()
        env = agents_environment(secret)
        job_id = slurm.submit([*self._sbatch_options(), "--wrap", self._batch_command()], env)
        attached = _Attached(job_id, secret, [])
        self._write_cache(attached)  # before waiting: a later program can still cancel it
        try:
            attached.addresses = self._wait_for_agents(job_id)
        except BaseException:
            self._attached = attached
            self._cancel(wait=False)
            raise
        self._write_cache(attached)
        logger.info("SLURM job %s runs host agents at %s", job_id, attached.addresses)
        return attached

    def _sbatch_options(self) -> list[str]:
        spec = self._spec
        nodes = sum(spec["meshes"].values())
        options = [f"--nodes={nodes}", "--ntasks-per-node=1", f"--job-name={spec['job_name']}"]
        flags = {
            "time": spec["time_limit"],
            "partition": spec["partition"],
            "gpus-per-node": spec["gpus_per_node"],
            "cpus-per-task": spec["cpus_per_task"],
            "mem": spec["mem"],
            "account": spec["account"],
            "qos": spec["qos"],
        }
        options += [f"--{flag}={value}" for flag, value in flags.items() if value is not None]
        if spec["exclusive"]:
            options.append("--exclusive")
        output = self._log_file("%j")  # sbatch's pattern for the job id
        if output is not None:
            os.makedirs(os.path.dirname(output), exist_ok=True)
            options.append(f"--output={output}")
        return options + spec["slurm_args"]

    def _batch_command(self) -> str:
        """The batch script's one command: a step of one agent per node that ends the job
        when any agent ends."""
        nodes = sum(self._spec["meshes"].values())
        argv = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
        argv += ["--kill-on-bad-exit=1", "--job-name=monarch-hosts"]
        argv += [self._spec["python_exe"], "-m", __name__, "--port", str(self._spec["monarch_port"])]
        return "exec " + shlex.join(argv)

    def _wait_for_agents(self, job_id: str) -> list[str]:
        """The agents' addresses once the job runs (within ``job_start_timeout``, by default
        as long as it waits in the queue) and every agent accepts connections; an error
        saying where the job's output is if the job ends first or they do not listen in time."""
        timeout = self._job_start_timeout
        try:
            running = slurm.wait_running(job_id, float("inf") if timeout is None else timeout)
        except slurm.SlurmJobEnded as e:
            raise self._agents_failed(
                e.job, ", ".join(e.job.nodes) or "its nodes", e.job.describe()
            ) from None
        port = self._spec["monarch_port"]
        hosts = slurm.node_addresses(running.nodes)
        addresses = [f"tcp:{hosts[node]}:{port}" for node in running.nodes]
        waiting = {node: hosts[node] for node in running.nodes}
        deadline = time.monotonic() + AGENTS_START_TIMEOUT_S
        while waiting:
            waiting = {node: host for node, host in waiting.items() if not _accepts(host, port)}
            if not waiting:
                break
            now = slurm.job(running.job_id)
            if now.ended or time.monotonic() > deadline:
                what = now.describe() if now.ended else f"after {AGENTS_START_TIMEOUT_S:g}s"
                raise self._agents_failed(now, ", ".join(waiting), what)
            time.sleep(slurm.POLL_INTERVAL_S)
        return addresses

    def _agents_failed(self, job: slurm.SlurmJob, where: str, what: str) -> RuntimeError:
        return RuntimeError(
            f"SlurmJob: the host agents on {where} did not listen at port {self._spec['monarch_port']} "
            f"({what}); the job's output is in {self._output_of(job)}\nHINT: the output says why "
            "(python_exe missing on the nodes or unable to import monarch, or the port taken: "
            "choose another monarch_port)"
        )

    def _log_file(self, job_id: str) -> str | None:
        """Where the job's output goes with ``log_dir`` (None: sbatch's default)."""
        log_dir = self._spec["log_dir"]
        return (
            None if log_dir is None else f"{os.path.abspath(log_dir)}/{self._spec['job_name']}-{job_id}.out"
        )

    def _output_of(self, job: slurm.SlurmJob) -> str:
        return (
            self._log_file(job.job_id)
            or job.output.replace("%j", job.job_id)  # SLURM's pattern, where it says
            or f"{job.workdir}/slurm-{job.job_id}.out (unless slurm_args set --output)"
        )

    def _cancel(self, wait: bool = True) -> None:
        attached, self._attached = self._attached, None
        if attached is None:
            return
        slurm.cancel(attached.job_id)
        self._remove_cache(attached.job_id)
        if not wait:
            return
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while True:
            now = slurm.job(attached.job_id)
            if now.ended and "COMPLETING" not in now.flags:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"SlurmJob.kill: {now.describe()} {KILL_TIMEOUT_S:g}s after scancel\n"
                    f"HINT: `scontrol show job {attached.job_id}` shows what SLURM waits for"
                )
            time.sleep(slurm.POLL_INTERVAL_S)

    # ---- the cached state

    def _from_cache(self, path: str) -> _Attached | None:
        """The running job ``path`` records, if it runs this spec; a job of another spec is
        cancelled, and a record of an ended job removed."""
        record = _read_cache(path)
        if record is None:
            return None
        job_id = str(record["job_id"])
        try:
            now = slurm.job(job_id)
        except slurm.SlurmError:  # forgotten by SLURM: it ended long ago
            now = None
        if now is None or now.ended:
            logger.info("SLURM job %s of %s has ended: submitting a new one", job_id, path)
            _remove(path)
            return None
        if record.get("spec") != json.loads(json.dumps(self._spec)):
            logger.warning(
                "SLURM job %s of %s runs another spec: cancelling it, submitting a new one", job_id, path
            )
            slurm.cancel(job_id)
            _remove(path)
            return None
        attached = _Attached(job_id, str(record["secret"]), list(record.get("addresses") or []))
        if not attached.addresses:  # the program that submitted it stopped before the agents ran
            self._attached = attached
            attached.addresses = self._wait_for_agents(job_id)
            self._write_cache(attached)
        logger.info("re-attaching to SLURM job %s (recorded in %s)", job_id, path)
        return attached

    def _write_cache(self, attached: _Attached) -> None:
        if not self._cached_path:
            return
        record = {
            "kind": _CACHE_KIND,
            "version": _CACHE_VERSION,
            "job_id": attached.job_id,
            "spec": self._spec,
            "secret": attached.secret,
            "addresses": attached.addresses,
        }
        path = os.path.abspath(self._cached_path)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        # A fresh file of an unpredictable name (mode 600): a file planted at a predictable one
        # by another user would be given the job's secret.
        fd, partial = tempfile.mkstemp(
            prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path)
        )
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(record, out)
            os.replace(partial, path)
        except BaseException:
            _remove(partial)
            raise

    def _remove_cache(self, job_id: str) -> None:
        """Remove the cached state if it still records ``job_id``."""
        path = self._cached_path
        if path:
            record = _read_cache(path)
            if record is not None and str(record.get("job_id")) == job_id:
                _remove(path)


def _read_cache(path: str) -> dict[str, Any] | None:
    """The record at ``path`` (None where there is none); an error for a file others could
    have read (the secret) or written (a record that sends this client elsewhere)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as file:
        st = os.fstat(file.fileno())
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ValueError(
                f"SlurmJob: the cached job state {path} is not private to this user (owner uid "
                f"{st.st_uid}, mode {st.st_mode & 0o777:o}): it holds the job's secret\n"
                f"HINT: remove it (`scancel` the job it names if that still runs), or pass another cached_path"
            )
        try:
            record = json.load(file)
        except ValueError as e:
            raise ValueError(
                f"SlurmJob: the cached job state {path} is not a SlurmJob record ({e})\n"
                "HINT: remove it, or pass another cached_path"
            ) from None
    if not isinstance(record, dict) or record.get("kind") != _CACHE_KIND:
        raise ValueError(
            f"SlurmJob: {path} holds no SlurmJob state (another job kind, or an older file)\n"
            "HINT: remove it, or pass another cached_path"
        )
    return record


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _accepts(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _check_reachable_client() -> None:
    """Refuse, before anything is submitted or attached, a client the agents could not reach
    back (their sessions connect to it)."""
    from monarch._src.runtime.config import CONFIG
    from monarch._src.transport.address import TcpAddress, is_loopback

    if CONFIG.transport not in ("tcp", "tls") or is_loopback(str(TcpAddress(CONFIG.tcp_bind_host, 1))):
        raise ValueError(
            f"SlurmJob: this client listens on {CONFIG.transport} at {CONFIG.tcp_bind_host}, which "
            "the SLURM nodes cannot connect back to\nHINT: set MONARCH_TRANSPORT=tcp and "
            "MONARCH_TCP_BIND_HOST to an address of this machine that the nodes reach (or call "
            "enable_transport('tcp') first thing, with tcp_bind_host set)"
        )


def agent_main(argv: Sequence[str] | None = None) -> int:
    """The task srun runs on each node: an agent at this node's ``NodeAddr`` and the job's
    port, serving clients until the job ends."""
    import argparse

    from monarch._src.host.agent import SECRET_ENV, log_to_stderr, serve
    from monarch._src.transport.address import listen_tcp

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    secret = os.environ.pop(SECRET_ENV, "")
    node = os.environ.get("SLURMD_NODENAME")
    if not secret or not node:
        sys.stderr.write(
            f"monarch host agent: run by SlurmJob through srun, which gives it {SECRET_ENV} and "
            "SLURMD_NODENAME; some are missing (did slurm_args change --export?)\n"
        )
        return 2
    log_to_stderr("info")
    try:
        host = slurm.node_addresses([node])[node]
        sock = listen_tcp(host, args.port)
    except (slurm.SlurmError, OSError) as e:
        sys.stderr.write(f"monarch host agent on {node}: cannot listen at port {args.port}: {e}\n")
        return 2
    serve(sock, secret.encode(), exit_with_parent=True)
    return 0


if __name__ == "__main__":
    sys.exit(agent_main())
