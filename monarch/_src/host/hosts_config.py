"""``hosts_from_config(name)``: the hosts of a job, from the configuration named ``name``.

The environment variable ``name`` holds one of the forms in ``FORMS``. Each form is
``<scheme>:<rest>`` or a list of agent addresses, so a scheduler (``slurm``) is one more
scheme, parsed here and served by a module of its own (``slurm_hosts.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from monarch._src.host.host_mesh import HostMesh, attach
from monarch._src.host.workers import host_address

if TYPE_CHECKING:
    import socket
    import subprocess

FORMS = """the accepted forms are:
  local:N                   N host agents started on this machine, torn down with the mesh
  ADDRESS[,ADDRESS...]      running host agents (python -m monarch.host): unix:/path/agent.sock
                            (Monarch's ipc:///path and tcp://host:port are accepted too)
  /path/to/file             a file holding either form (addresses one per line or comma-separated;
                            lines starting with # are comments)
  slurm                     inside a SLURM allocation (sbatch, salloc): one host agent per node,
                            started with srun, in the order of SLURM_JOB_NODELIST
Agents at given addresses are reached with the shared secret in MONARCH_HOST_SECRET or
MONARCH_HOST_SECRET_FILE."""

_ADDRESS_SCHEMES = ("unix:", "tcp:", "ipc://", "tcp://")
#: Seconds local agents get to exit after their client detached, before they are killed.
LOCAL_AGENT_EXIT_S = 5.0


def _error(name: str, what: str) -> ValueError:
    return ValueError(f"hosts_from_config({name!r}): {what}\n{FORMS}")


def hosts_from_config(name: str) -> HostMesh:
    """A ``{"hosts": N}`` HostMesh from the configuration in environment variable ``name``
    (see ``FORMS``); returned at once, attaching in the background."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        raise _error(name, f"the environment variable {name} is not set")
    return _hosts_from(name, value.strip(), allow_file=True)


def hosts_from_value(value: str, source: str) -> HostMesh:
    """:func:`hosts_from_config` for a value given directly (e.g. a command-line flag);
    ``source`` names where it came from in error messages."""
    if not value.strip():
        raise _error(source, "the value is empty")
    return _hosts_from(source, value.strip(), allow_file=True)


def _hosts_from(name: str, value: str, allow_file: bool) -> HostMesh:
    scheme, colon, rest = value.partition(":")
    if colon and scheme == "local":
        if not rest.isdigit() or int(rest) < 1:
            raise _error(name, f"{value!r}: local:N takes a positive number of hosts")
        return local_hosts(int(rest))
    if scheme == "slurm":
        if rest:
            raise _error(name, f"{value!r}: slurm takes no options; the allocation says which nodes")
        from monarch._src.host.slurm import SlurmError
        from monarch._src.host.slurm_hosts import slurm_hosts

        try:
            return slurm_hosts(name)
        except SlurmError as e:
            raise _error(name, str(e)) from None
    if allow_file and not value.startswith(_ADDRESS_SCHEMES) and os.path.isfile(value):
        with open(value) as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
        text = ",".join(line for line in lines if line)
        if not text:
            raise _error(name, f"the file {value} names no hosts")
        return _hosts_from(name, text, allow_file=False)
    addresses = [a.strip() for a in value.replace("\n", ",").split(",") if a.strip()]
    bad = [a for a in addresses if not a.startswith(_ADDRESS_SCHEMES)]
    if bad or not addresses:
        raise _error(name, f"{bad[0] if bad else value!r} is not a host agent address, nor a file")
    from monarch._src.host.agent import read_secret

    secret = read_secret()
    if secret is None:
        raise ValueError(
            f"hosts_from_config({name!r}): no secret to attach to the host agents with\n"
            "HINT: set MONARCH_HOST_SECRET or MONARCH_HOST_SECRET_FILE to the agents' secret."
        )
    return attach([host_address(a) for a in addresses], secret, name)


def start_local_agent(
    sock: socket.socket, secret: bytes, env: Mapping[str, str]
) -> tuple[str, subprocess.Popen[bytes]]:
    """A host agent on this machine, adopting the listening ``sock`` (closed here) and reading
    ``secret`` from a pipe, never its environment; it serves one client and exits with this
    process. Returns its address and process."""
    import subprocess  # only where local agents are started

    from monarch._src.host.spawner import secret_pipe, worker_pythonpath
    from monarch._src.transport.address import of_listening_socket

    env = dict(env, PYTHONPATH=worker_pythonpath(env.get("PYTHONPATH")))
    try:
        secret_r = secret_pipe(secret)
    except BaseException:
        sock.close()
        raise
    try:
        command = [sys.executable, "-m", "monarch.host", "--listen-fd", str(sock.fileno())]
        command += ["--secret-fd", str(secret_r), "--once", "--exit-with-parent", "--log-level", "warning"]
        address = of_listening_socket(sock)
        return address, subprocess.Popen(
            command, pass_fds=(sock.fileno(), secret_r), env=env, start_new_session=True
        )
    finally:
        sock.close()
        os.close(secret_r)


class LocalAgents:
    """Host agents this client started on its own machine (``local:N``, ``ProcessJob``)."""

    def __init__(self, count: int, env: Mapping[str, str] | None = None) -> None:
        from monarch._src.actor.process_state import runtime
        from monarch._src.transport.auth import new_secret

        rt = runtime()
        self.secret = new_secret()
        self.addresses: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        child_env = dict(os.environ)
        child_env.update(env or {})
        try:
            for _ in range(count):
                sock = rt.new_listen_socket()  # on this client's transport
                address, proc = start_local_agent(sock, self.secret, child_env)
                self.addresses.append(address)
                self.procs.append(proc)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Wait for the agents to exit (their client detached), killing those that do not."""
        from monarch._src.host.spawner import reap

        reap(self.procs, LOCAL_AGENT_EXIT_S)


def local_hosts(count: int, env: Mapping[str, str] | None = None) -> HostMesh:
    """``count`` host agents started here, as a ``{"hosts": count}`` mesh; they exit when it
    is shut down, or when this client exits."""
    agents = LocalAgents(count, env)
    return attach(agents.addresses, agents.secret, f"local:{count}", on_shutdown=agents.stop)
