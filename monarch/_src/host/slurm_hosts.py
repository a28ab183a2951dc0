"""``hosts_from_config`` with the value ``slurm``: inside a SLURM allocation, one host agent per
node of it, started with ``srun``, as a ``{"hosts": SLURM_NNODES}`` HostMesh in node-list order.

The client runs one job step, ``srun --nodes=N --ntasks=N --ntasks-per-node=1``, whose task on
each node is this module (``python -m monarch._src.host.slurm_hosts``): a host agent listening
on TCP at the node's address toward the client (the interface that routes to
``SLURM_LAUNCH_NODE_IPADDR``, where srun runs; on an ephemeral port), which prints
``<SLURM_NODEID> <address>`` on stdout and then serves. The client reads the N lines from srun
and attaches to the agents in ``SLURM_NODEID`` order, which is the order of
``SLURM_JOB_NODELIST`` (``slurm.allocation``).

The secret is fresh for each mesh and reaches the agents through srun's environment
(``MONARCH_HOST_SECRET``; SLURM hands the submitting environment to the tasks), never a command
line: only the user (and root) can read another process's environment. The agent takes it out
of its own environment before its sessions start.

Lifetime: the agents serve one client (``--once``): when the mesh is shut down, or the
client's connections drop (it exited or was killed), they exit and the step ends. Cancelling
the step (``scancel``) stops them the same way, and the client loses the hosts at once.
"""

from __future__ import annotations

import os
import queue
import secrets
import subprocess
import sys
import threading
from collections import deque

from monarch._src.host import slurm
from monarch._src.host.host_mesh import HostMesh, attach

#: How long the agents may take to start and say where they listen (an srun step starts in
#: well under a second; a python interpreter per node adds a few hundred milliseconds).
AGENTS_START_TIMEOUT_S = 60.0
#: Seconds the step gets to end after the client detached, before srun is told to end it.
STEP_EXIT_S = 5.0
_TAIL_LINES = 20


def agents_environment(secret: str) -> dict[str, str]:
    """This client's environment as SLURM is to hand it to host agents on the nodes: with
    ``secret`` (never on a command line), monarch importable, and none of this machine's own
    settings (``configure``'s ``tcp_bind_host`` names an address of this machine, not theirs)."""
    from monarch._src.host.agent import SECRET_ENV, SECRET_FILE_ENV
    from monarch._src.host.spawner import worker_pythonpath
    from monarch._src.runtime.config import OVERRIDES_ENV, overrides_for_another_host

    env = dict(os.environ, **{SECRET_ENV: secret})
    env.pop(SECRET_FILE_ENV, None)  # it would take precedence over ours in the agents
    env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH"))
    portable = overrides_for_another_host()
    if portable is None:
        env.pop(OVERRIDES_ENV, None)
    else:
        env[OVERRIDES_ENV] = portable
    return env


class SlurmAgents:
    """The srun step running one host agent per node, and the addresses the agents printed."""

    def __init__(self, allocation: slurm.Allocation) -> None:
        self.allocation = allocation
        self.secret = secrets.token_hex(32)
        count = allocation.num_nodes
        env = agents_environment(self.secret)
        command = [
            slurm.command_path("srun", env),
            f"--nodes={count}",
            f"--ntasks={count}",
            "--ntasks-per-node=1",
        ]
        # srun passes each task's output on in whole lines (--unbuffered would mix them)
        command += ["--kill-on-bad-exit=1", "--job-name=monarch-hosts"]
        command += [sys.executable, "-m", __name__]
        self.stderr_tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self.srun = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a Ctrl-C reaches the client, whose shutdown ends the step
        )
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(
            target=self._read_stdout, args=(lines,), name="monarch-srun-out", daemon=True
        ).start()
        self._stderr_relay = threading.Thread(target=self._relay_stderr, name="monarch-srun-err", daemon=True)
        self._stderr_relay.start()
        try:
            self.addresses = self._collect(lines, count)
        except BaseException:
            self.stop()
            raise

    def _read_stdout(self, lines: queue.Queue[str | None]) -> None:
        assert self.srun.stdout is not None
        for line in self.srun.stdout:
            lines.put(line)
        lines.put(None)

    def _relay_stderr(self) -> None:
        """srun's and the agents' stderr goes to the client's, and its tail into errors."""
        assert self.srun.stderr is not None
        for line in self.srun.stderr:
            self.stderr_tail.append(line)
            sys.stderr.write(line)

    def _collect(self, lines: queue.Queue[str | None], count: int) -> list[str]:
        """The agents' addresses in SLURM_NODEID order, as they print them."""
        found: dict[int, str] = {}
        while len(found) < count:
            try:
                line = lines.get(timeout=AGENTS_START_TIMEOUT_S)
            except queue.Empty:
                waited = f"after {AGENTS_START_TIMEOUT_S:g}s only {len(found)} of them said where they listen"
                raise self._failure(waited) from None
            if line is None:
                code = self.srun.wait()
                self._stderr_relay.join(STEP_EXIT_S)  # srun's last words, to quote them
                raise self._failure(
                    f"srun exited with code {code} before {count - len(found)} of them started"
                )
            node_id, _, address = line.strip().partition(" ")
            if node_id.isdigit() and address.startswith("tcp:"):
                found[int(node_id)] = address
        return [found[i] for i in range(count)]

    def _failure(self, what: str) -> RuntimeError:
        tail = "".join(self.stderr_tail).strip()
        return RuntimeError(
            f"hosts_from_config: the host agents of SLURM job {self.allocation.job_id} did not start: "
            f"{what}" + (f"; srun's last words:\n{tail}" if tail else "") + "\nHINT: run "
            "`srun --nodes=1 python -m monarch.host --help` inside the allocation to check that "
            "every node can run python with monarch installed"
        )

    def stop(self) -> None:
        """Let the step end (the agents exit once their client is gone); end it if it lingers."""
        for ask in (None, self.srun.terminate, self.srun.kill):  # srun cancels the step on SIGTERM
            if ask is not None:
                ask()
            try:
                self.srun.wait(STEP_EXIT_S)
                return
            except subprocess.TimeoutExpired:
                continue


def slurm_hosts(name: str) -> HostMesh:
    """One host agent per node of the allocation this process runs in (see the module
    docstring), as a ``{"hosts": N}`` mesh in node-list order."""
    agents = SlurmAgents(slurm.allocation())
    return attach(agents.addresses, agents.secret.encode(), name, on_shutdown=agents.stop)


def agent_main() -> int:
    """The task srun runs on each node: an agent at this node's address toward the client,
    announced on stdout, serving one client."""
    from monarch._src.host.agent import SECRET_ENV, log_to_stderr, serve
    from monarch._src.transport.address import address_toward, listen_tcp, of_listening_socket

    secret = os.environ.pop(SECRET_ENV, "")
    client = os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
    node_id = os.environ.get("SLURM_NODEID")
    if not secret or not client or node_id is None:
        sys.stderr.write(
            "monarch host agent: run by hosts_from_config through srun, which gives it "
            f"{SECRET_ENV}, SLURM_LAUNCH_NODE_IPADDR and SLURM_NODEID; some are missing\n"
        )
        return 2
    log_to_stderr("warning")
    sock = listen_tcp(address_toward(client), 0)
    print(node_id, of_listening_socket(sock), flush=True)
    serve(sock, secret.encode(), once=True)
    return 0


if __name__ == "__main__":
    sys.exit(agent_main())
