"""A throw-away SLURM cluster on this machine, for tests: real ``slurmctld``, ``slurmd`` and
``munged`` (Debian's slurm-wlm 22.05 and munge), up in about a second.

Every daemon runs in a host of a ``netns.Cluster``, each with its own network stack, address
and hostname (a UTS namespace of its own): host 0 is the controller (``slurmctld`` and a
private ``munged``), hosts 1..N are the nodes ``n1``..``nN`` (one ``slurmd`` each). Clients
(``srun``, ``sbatch``, ...) run where the test runs, in the root namespace, and reach the
controller and the nodes over the bridge; they find the cluster through ``SLURM_CONF`` (in
``env``), which SLURM passes on to every job.

Nothing outside the cluster's own temporary directory is touched: no /etc/slurm, no
/etc/hosts, no system munged (ours has its own key and socket, named in slurm.conf with
``AuthInfo=socket=``), and no port of the root namespace, so parallel clusters never collide.
Because every daemon lives in one of the cluster's namespaces, tearing the namespaces down
(``netns.Cluster.close``) kills every daemon and every job step, even those of a test that
failed or was interrupted; a run killed before its teardown leaves namespaces that
``netns.remove_stale`` removes, and a directory that ``remove_stale`` removes.

Why a few settings are what they are (see the SLURM test-cluster spec): ``nsenter --net=``
(not ``ip netns exec``) keeps /sys/fs/cgroup visible, which slurmd 22.05 needs;
``batch_sched_delay=0`` starts batch jobs at once instead of on 3 s ticks;
``config_overrides`` lets a node declare CPUs the machine may not have.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import netns
import psutil
from helpers import REPO, all_processes, running, wait_gone

#: The commands a cluster needs, and the Debian package of each (scripts/setup.sh installs them).
PROGRAMS = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "srun": "slurm-client",
    "munged": "munge",
    "unshare": "util-linux",
}
SBIN = "/usr/sbin:/sbin"
#: How long the nodes may take to be ``idle`` (about 1 s is usual).
UP_TIMEOUT_S = 20.0
#: A client command against a cluster that is up answers in milliseconds.
CLIENT_TIMEOUT_S = 20.0
CPUS_PER_NODE = 2
DIR_PREFIX = "monarch-slurm-"
_DIR_NAME = re.compile(re.escape(DIR_PREFIX) + r"(?P<pid>\d+)-\w+")
CONTROLLER_NAME = "ctl"
CONF_NAME = "slurm.conf"


def read_result(client: subprocess.Popen[str]) -> Any:
    """The JSON a client printed on a line ``RESULT <json>``; its stderr where it printed none."""
    assert client.stdout is not None
    line = client.stdout.readline()
    assert line.startswith("RESULT "), client.communicate(timeout=30)[1]
    return json.loads(line[len("RESULT ") :])


#: What ``SlurmCluster.break_job`` can do to a job.
JOB_FAULTS = ("agent-killed", "scancel")


class SlurmClusterError(RuntimeError):
    """The cluster did not come up; the message carries the daemons' logs."""


def _which(program: str) -> str | None:
    return shutil.which(program, path=os.environ.get("PATH", "") + os.pathsep + SBIN)


def unavailable_reason() -> str | None:
    """Why this machine cannot run a cluster (no network namespaces, SLURM or munge not
    installed), or None when it can."""
    missing = sorted({pkg for prog, pkg in PROGRAMS.items() if _which(prog) is None})
    if missing:
        return (
            f"SLURM test cluster: {', '.join(missing)} not installed; HINT: run scripts/setup.sh "
            "as root on Debian (it installs them with apt-get)"
        )
    return netns.unavailable_reason()


def kill_clients(conf: Path) -> list[int]:
    """SIGKILL every process (but this one) whose environment names ``conf`` as its
    ``SLURM_CONF``: the clients of that cluster (``srun``, ``sbatch --wait``, a test's
    controller...), which would otherwise wait for a cluster that is gone. Returns their pids
    once they are gone."""
    found = []
    for proc in all_processes():
        try:
            if proc.pid != os.getpid() and proc.environ().get("SLURM_CONF") == str(conf):
                proc.kill()
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    left = wait_gone(found)
    if left:
        raise SlurmClusterError(f"clients {left} of the cluster at {conf} survived SIGKILL")
    return found


def remove_stale() -> list[Path]:
    """Remove what is left of earlier clusters whose creating process is dead: their
    directories and their clients (their namespaces, daemons and jobs included, are
    ``netns.remove_stale``'s). Returns the directories removed."""
    stale = []
    for path in Path(tempfile.gettempdir()).glob(DIR_PREFIX + "*"):
        match = _DIR_NAME.fullmatch(path.name)
        if match and not running([int(match["pid"])]):
            kill_clients(path / CONF_NAME)
            shutil.rmtree(path, ignore_errors=True)
            stale.append(path)
    return stale


class SlurmCluster:
    """A controller and ``nodes`` SLURM nodes; a context manager whose exit (also on a failure
    or an interrupt) kills every daemon and job and removes every namespace and file it made."""

    def __init__(self, nodes: int, cpus_per_node: int = CPUS_PER_NODE) -> None:
        self.node_names = tuple(f"n{i}" for i in range(1, nodes + 1))
        self.cpus_per_node = cpus_per_node
        self.hosts = netns.Cluster(nodes + 1)
        self.dir = Path()
        self.conf = Path()
        self.env: dict[str, str] = {}
        self._daemons: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:  # a half-started cluster goes too
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- the cluster's parts

    @property
    def controller(self) -> netns.Host:
        return self.hosts.hosts[0]

    def node_host(self, name: str) -> netns.Host:
        """The namespace host that runs node ``name``."""
        return self.hosts.hosts[self.node_names.index(name) + 1]

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket"

    def log_dir(self) -> Path:
        return self.dir / "log"

    # ---- start

    def _start(self) -> None:
        # World-searchable: munged insists that every directory above its socket is.
        self.dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        self.dir.chmod(0o755)
        for sub in ("munge", "log", "state", *(f"spool/{n}" for n in self.node_names)):
            (self.dir / sub).mkdir(parents=True)
        self.conf = self.dir / CONF_NAME
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.env["PATH"] = self.env.get("PATH", "") + os.pathsep + SBIN
        self.hosts.__enter__()
        self._write_conf()
        self._start_munged()
        self._spawn(0, CONTROLLER_NAME, "slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for name in self.node_names:
            index = self.node_host(name).index
            self._spawn(index, name, f"slurmd.{name}", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait_idle()

    def _write_conf(self) -> None:
        d = self.dir
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={self.node_host(name).address} CPUs={self.cpus_per_node} "
            "RealMemory=1000 State=UNKNOWN"
            for name in self.node_names
        )
        self.conf.write_text(
            f"""\
ClusterName=mtest
SlurmctldHost={CONTROLLER_NAME}({self.controller.address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=2
MinJobAge=300
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
        )

    def _spawn(self, host: int, hostname: str, log: str, argv: Sequence[str]) -> None:
        """Start ``argv`` in host ``host`` under its own hostname, output to ``log/<log>.out``;
        the host's teardown kills it."""
        with (self.log_dir() / f"{log}.out").open("wb") as out:
            self._daemons[log] = self.hosts.popen(
                host,
                ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a Ctrl-C reaches the test run, whose teardown stops us
            )

    def _start_munged(self) -> None:
        """A munged of this cluster's own (key, socket, pid file): the machine's munged, if
        any, is neither needed nor touched. Its Unix socket is a path, so the nodes in other
        network namespaces reach it too."""
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        m = self.dir / "munge"
        self._spawn(
            0,
            CONTROLLER_NAME,
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
        )
        self._wait("munged to create its socket", self.munge_socket.exists)

    def _wait(self, what: str, ready: Any) -> None:
        """Poll ``ready`` until it is true; fail with the logs when a daemon exits or at the
        deadline."""
        deadline = time.monotonic() + UP_TIMEOUT_S
        while not ready():
            dead = [name for name, proc in self._daemons.items() if proc.poll() is not None]
            if dead:
                raise SlurmClusterError(f"{dead} exited while waiting for {what}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"timed out after {UP_TIMEOUT_S}s waiting for {what}\n{self.logs()}")
            time.sleep(0.02)

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo`` reports it (``idle``, ``alloc``, ``unk*``...)."""
        done = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"])
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())

    def _wait_idle(self) -> None:
        def all_idle() -> bool:
            states = self.node_states()
            return all(states.get(n) == "idle" for n in self.node_names)

        self._wait(f"nodes {list(self.node_names)} to be idle", all_idle)

    # ---- use

    def run(
        self, argv: Sequence[str], timeout: float = CLIENT_TIMEOUT_S, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """A client command (``srun``, ``sbatch``...) in the root namespace, with this cluster's
        ``SLURM_CONF``; output captured as text."""
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs
        )

    def pids(self, name: str) -> list[int]:
        """The processes running now in the namespace of node ``name`` (its slurmd, job steps
        and tasks) or of the controller (``CONTROLLER_NAME``: slurmctld, munged)."""
        host = self.controller if name == CONTROLLER_NAME else self.node_host(name)
        done = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True, timeout=30)
        return [int(p) for p in done.stdout.split()]

    def break_job(self, fault: str, job_id: str, agent_module: str) -> None:
        """Apply one of ``JOB_FAULTS`` to a running job: kill -9 the host agent (``python -m
        agent_module``) on the last node, or ``scancel`` the job."""
        if fault == "scancel":
            assert self.run(["scancel", job_id]).returncode == 0
            return
        assert fault == "agent-killed", fault
        (agent,) = [
            pid
            for pid in self.pids(self.node_names[-1])
            if psutil.Process(pid).cmdline()[1:3] == ["-m", agent_module]
        ]
        os.kill(agent, signal.SIGKILL)

    def node_pids(self) -> dict[str, list[int]]:
        """Each node's processes now, by node name."""
        return {name: self.pids(name) for name in self.node_names}

    def all_pids(self) -> list[int]:
        """Every process of the cluster: its daemons, job steps and tasks."""
        return [p for name in (CONTROLLER_NAME, *self.node_names) for p in self.pids(name)]

    def allocation_client(self, code: str, **env: str) -> subprocess.Popen[str]:
        """Python ``code`` run by ``salloc`` in an allocation of every node: a ``client``
        that ``salloc`` starts; ``env`` added to its environment."""
        return self.client(["salloc", f"--nodes={len(self.node_names)}"], code, REPO, **env)

    def client(
        self, prefix: Sequence[str], code: str, cwd: Path, *args: str, **env: str
    ) -> subprocess.Popen[str]:
        """Python ``code`` (with ``args``) run in ``cwd`` by ``prefix`` (say, ``salloc``; empty:
        outside any allocation): a monarch client in the root namespace, listening on TCP at
        the bridge address, where the nodes reach it; ``env`` added to its environment, text
        pipes for stdin, stdout and stderr. The caller ends it (``close`` would kill it too)."""
        tcp = {"MONARCH_TRANSPORT": "tcp", "MONARCH_TCP_BIND_HOST": self.hosts.bridge_address}
        return subprocess.Popen(
            [*prefix, sys.executable, "-c", code, *args],
            env={**self.env, **tcp, **env},
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def logs(self) -> str:
        """The daemons' logs, for an error message."""
        parts = []
        for path in sorted(self.log_dir().glob("*")):
            text = path.read_text(errors="replace").strip()
            parts.append(f"--- {path.name}\n{text[-4000:]}")
        return "\n".join(parts)

    # ---- stop

    def close(self) -> None:
        """Kill the cluster's clients and every daemon and job process (they all live in the
        hosts), remove the hosts and the directory. Idempotent."""
        try:
            if self.conf != Path():
                kill_clients(self.conf)
            self.hosts.close()
        finally:
            if self.dir != Path():
                shutil.rmtree(self.dir, ignore_errors=True)
