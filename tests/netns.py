"""A cluster of Linux network namespaces on this one machine, for tests of many hosts.

Each host is a network namespace with its own loopback and one veth whose other end is a port
of a bridge in the *root* namespace. The bridge holds the subnet's first address, so a process
in the root namespace (the test itself, or slurmctld and srun in the SLURM recipe,
the SLURM test-cluster spec §5.2, named in DESIGN §8) reaches every host and is reached from them at
``Cluster.bridge_address``. A bridge in a namespace of its own would cut the root namespace off.

Commands enter a host with ``nsenter --net=`` rather than ``ip netns exec``: the latter also
makes a mount namespace with a fresh /sys, which hides /sys/fs/cgroup and makes slurmd 22.05
fail (the same recipe, §5.3). nsenter execs, so a ``popen`` pid is the command's own pid.

Every name carries the creating pid and a random tag (namespaces ``mtest-<pid>-<tag>-h<i>``,
links ``mt-<pid>-<tag>-br`` / ``mt-<pid>-<tag>-<i>``, at most 15 characters), and every cluster
takes a /24 of 198.18.0.0/15 (the benchmarking range) that no address of the root namespace
uses yet, so parallel runs on one machine never collide. A run killed before its teardown
leaves namespaces and links behind; ``remove_stale`` removes those whose creating pid is dead.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from helpers import running, wait_gone

NETNS_DIR = Path("/var/run/netns")  # where `ip netns add` names namespaces
TEST_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
#: Serialises the choice of a run's tag and subnet between processes until its bridge holds it.
LOCK_PATH = Path("/run/lock/monarch-mtest-netns.lock")
MAX_HOSTS = 99  # two digits keep a veth name within the kernel's 15 characters
KILL_TIMEOUT_S = 5.0
_TAG_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"

_NETNS_NAME = re.compile(r"mtest-(?P<run>\d+-[0-9a-z]{2})-h\d+")
_LINK_NAME = re.compile(r"mt-(?P<run>\d+-[0-9a-z]{2})-(?:br|\d+)")


class NetnsError(RuntimeError):
    """An ``ip`` command failed, or a run's namespaces, links or processes would not go."""


@dataclass(frozen=True)
class Host:
    """One host of a cluster: its network namespace and its address on the cluster's bridge."""

    index: int
    netns: str
    address: str


def _ip(*args: str) -> None:
    """Run ``ip args``; raise NetnsError with its stderr when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


def _existing() -> tuple[list[str], list[str]]:
    """Names of this module's namespaces and root-namespace links that exist now."""
    spaces = os.listdir(NETNS_DIR) if NETNS_DIR.is_dir() else []
    links = [name for _, name in socket.if_nameindex()]
    return (
        [n for n in spaces if _NETNS_NAME.fullmatch(n)],
        [n for n in links if _LINK_NAME.fullmatch(n)],
    )


def _run_of(name: str) -> re.Match[str]:
    match = _NETNS_NAME.fullmatch(name) or _LINK_NAME.fullmatch(name)
    assert match is not None, name
    return match


def runs_present() -> set[str]:
    """The run ids of every cluster (live or stale) whose namespaces or links exist now."""
    spaces, links = _existing()
    return {_run_of(n)["run"] for n in spaces + links}


def names_of(run: str) -> list[str]:
    """The namespaces and root-namespace links of run ``run`` that exist now."""
    spaces, links = _existing()
    return [n for n in spaces + links if _run_of(n)["run"] == run]


def _pids_in(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, timeout=30)
    return [int(p) for p in done.stdout.split()]


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _kill_processes_in(netns: str, grace_s: float = 0.0) -> None:
    """SIGKILL every process in ``netns`` until none is left (a process may fork meanwhile); with
    ``grace_s``, SIGTERM them first and give them that long to exit on their own."""
    if grace_s > 0:
        pids = _pids_in(netns)
        _signal_all(pids, signal.SIGTERM)
        wait_gone(pids, grace_s)
    for _ in range(10):
        pids = _pids_in(netns)
        if not pids:
            return
        _signal_all(pids, signal.SIGKILL)
        left = wait_gone(pids, KILL_TIMEOUT_S)
        if left:
            raise NetnsError(f"processes {left} in {netns} survived SIGKILL")
    raise NetnsError(f"processes in {netns} keep forking faster than they are killed")


def _remove_run(run: str) -> None:
    """Remove everything of run ``run``: its processes, links and namespaces. Idempotent."""
    names = names_of(run)
    spaces = [n for n in names if _NETNS_NAME.fullmatch(n)]
    for netns in spaces:
        _kill_processes_in(netns)
    errors: list[str] = []
    # Deleting a root-side veth end or a namespace takes the peer end with it, so a later
    # delete may find its object gone already: only what is still there afterwards counts.
    for link in [n for n in names if n not in spaces]:
        try:
            _ip("link", "del", link)
        except NetnsError as e:
            errors.append(str(e))
    for netns in spaces:
        try:
            _ip("netns", "del", netns)
        except NetnsError as e:
            errors.append(str(e))
    if names_of(run):
        raise NetnsError(f"could not remove {names_of(run)}: " + "; ".join(errors))


def remove_stale() -> list[str]:
    """Remove the namespaces and links of earlier runs whose creating process is dead (a run
    killed before its teardown); return their run ids. Live runs, whoever made them, stay."""
    stale = sorted(r for r in runs_present() if not running([int(r.split("-")[0])]))
    for run in stale:
        _remove_run(run)
    return stale


def _new_run_tag() -> str:
    """A tag no run of this pid uses now (a dead run may have had our pid)."""
    present = runs_present()
    while True:
        run = f"{os.getpid()}-{''.join(secrets.choice(_TAG_CHARS) for _ in range(2))}"
        if run not in present:
            return run


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of TEST_RANGE that holds no address of the root namespace, from a random start."""
    done = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=30, check=True
    )
    used = {
        ipaddress.IPv4Interface(word).network.supernet(new_prefix=24)
        for word in done.stdout.split()
        if "/" in word and ipaddress.IPv4Interface(word).ip in TEST_RANGE
    }
    subnets = list(TEST_RANGE.subnets(new_prefix=24))
    start = secrets.randbelow(len(subnets))
    for subnet in subnets[start:] + subnets[:start]:
        if subnet not in used:
            return subnet
    raise NetnsError(f"every /24 of {TEST_RANGE} is in use on this machine")


class Cluster:
    """``size`` hosts in network namespaces on one bridge; a context manager whose exit (also
    on a failure or an interrupt) kills every process in the hosts and removes every namespace
    and link it made."""

    def __init__(self, size: int) -> None:
        if not 1 <= size <= MAX_HOSTS:
            raise ValueError(f"a cluster has 1 to {MAX_HOSTS} hosts, not {size}")
        self.size = size
        self.run_id = ""
        self.bridge = ""
        self.bridge_address = ""
        self.hosts: tuple[Host, ...] = ()
        self._popens: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> Cluster:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _build(self) -> None:
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        with LOCK_PATH.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.run_id = _new_run_tag()
            subnet = _free_subnet()
            addresses = list(subnet.hosts())
            self.bridge = f"mt-{self.run_id}-br"
            self.bridge_address = str(addresses[0])
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        hosts = []
        for i in range(self.size):
            host = Host(i, f"mtest-{self.run_id}-h{i}", str(addresses[i + 1]))
            veth = f"mt-{self.run_id}-{i}"
            _ip("netns", "add", host.netns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("link", "set", veth, "master", self.bridge, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
            hosts.append(host)
        self.hosts = tuple(hosts)

    def argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command line that runs in host ``i``'s network namespace."""
        return ["nsenter", f"--net={NETNS_DIR / self.hosts[i].netns}", "--", *argv]

    def run(
        self, i: int, argv: Sequence[str], *, timeout: float, **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run(argv, timeout=timeout, **kwargs)`` in host ``i``."""
        return subprocess.run(self.argv(i, argv), timeout=timeout, **kwargs)

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(argv, **kwargs)`` in host ``i``; killed and reaped by ``close``."""
        proc = subprocess.Popen(self.argv(i, argv), **kwargs)
        self._popens.append(proc)
        return proc

    def kill_processes(self, i: int, grace_s: float = 0.0) -> None:
        """Stop every process in host ``i`` (daemons too, which ``popen`` never saw): SIGTERM,
        SIGKILL for those left after ``grace_s``; return once none is left."""
        _kill_processes_in(self.hosts[i].netns, grace_s)

    def close(self) -> None:
        """Kill the processes of every host and remove the namespaces and links. Idempotent."""
        for proc in self._popens:
            # Killed directly too: a just-started nsenter may not have entered the namespace yet.
            proc.kill()
            with proc:  # closes its pipes and reaps it
                pass
        self._popens.clear()
        if self.run_id:
            _remove_run(self.run_id)


def unavailable_reason() -> str | None:
    """Why this machine cannot build a cluster (not root, no ``ip`` or ``nsenter``, no network
    namespaces, bridges or veths), or None when it can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (CAP_NET_ADMIN); running as uid {os.geteuid()}"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"`{tool}` not found; HINT: install {package} (scripts/setup.sh does as root)"
    probe = f"mtest-{_new_run_tag()}-h0"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "br0", "type", "bridge")
        _ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    except NetnsError as e:
        return f"this machine cannot make network namespaces, bridges and veths: {e}"
    finally:
        if os.path.exists(NETNS_DIR / probe):
            _ip("netns", "del", probe)
    return None
