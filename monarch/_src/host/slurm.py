"""Reading SLURM: the allocation a process runs in, the state of a job seen from outside, and
submitting and cancelling jobs, through SLURM's own commands.

Everything goes through the commands every SLURM installation has (``scontrol``, ``squeue``,
``sbatch``, ``scancel``) rather than a client library or slurmrestd, which many sites lack.
Node lists are expanded by ``scontrol show hostnames``, which is SLURM's own expansion (so the
order is SLURM's: the order of ``SLURM_NODEID``) and the same on every version.

Job state comes from ``squeue --json``, whose shape changed between versions (SLURM 22.05's
``openapi/v0.0.38`` against the ``data_parser`` v0.0.40+ of 23.11 and later): ``job_state`` is
a string there and a list of flags here, ``exit_code`` a raw wait status there and an object
here. ``job_from_json`` reads both. Two more 22.05 facts: ``squeue --json`` ignores
``--jobs`` (it lists every job, so the job is picked out here), and ``scontrol`` has no
``--json`` at all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

#: How long a SLURM command may take: slurmctld answers in milliseconds, but a client that
#: cannot reach it retries for about 10 s before it fails.
COMMAND_TIMEOUT_S = 30.0
#: Between two looks at a job that is starting.
POLL_INTERVAL_S = 0.05

#: Base states after which a job never runs again (``squeue``'s long names).
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


#: A job's base state is one of these; newer versions add flag words to it.
BASE_STATES = ENDED_STATES | {"PENDING", "RUNNING", "SUSPENDED"}

_UNREACHABLE_HINT = (
    "check that slurmctld is up (`scontrol ping`) and that SLURM_CONF (or /etc/slurm/slurm.conf) "
    "names this cluster"
)


class SlurmError(RuntimeError):
    """A SLURM command is missing or failed, or the environment is not a SLURM allocation."""


class SlurmJobEnded(SlurmError):
    """The job ended (failed, was cancelled, ran out of time...) while it was waited for."""

    def __init__(self, message: str, job: SlurmJob) -> None:
        super().__init__(message)
        self.job = job


@dataclass(frozen=True)
class Allocation:
    """The SLURM allocation this process runs in: the job, its nodes in SLURM's order, and
    which of them this process is on (None where SLURM does not say: in the shell ``salloc``
    starts, which runs on the submitting machine)."""

    job_id: str
    nodes: tuple[str, ...]
    node_index: int | None

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class SlurmJob:
    """A job as ``squeue`` shows it. ``state`` is the base state (``PENDING``, ``RUNNING``,
    ``COMPLETED``, ``FAILED``, ``CANCELLED``...); ``flags`` are the other state words newer
    versions add (``COMPLETING``, ``CONFIGURING``...). ``nodes`` is empty until the job has
    nodes. ``exit_code``/``signal`` are those of the batch script, once it ended. ``output`` is
    its output file where SLURM says (not 22.05), ``workdir`` the directory it runs in."""

    job_id: str
    state: str
    flags: tuple[str, ...] = ()
    nodelist: str = ""
    nodes: tuple[str, ...] = ()
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    output: str = ""
    workdir: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    def describe(self) -> str:
        """One line for an error message: state, reason, exit code or signal."""
        words = [f"SLURM job {self.job_id} is {self.state}"]
        if self.reason and self.reason != "None":
            words.append(f"(reason: {self.reason})")
        if self.signal:
            words.append(f"killed by signal {self.signal}")
        elif self.exit_code:
            words.append(f"exit code {self.exit_code}")
        return " ".join(words)


def command_path(name: str, env: Mapping[str, str] | None = None) -> str:
    """Where SLURM command ``name`` is (on ``env``'s PATH); a SlurmError saying what to
    install where it is missing."""
    path = shutil.which(name, path=(os.environ if env is None else env).get("PATH"))
    if path is None:
        raise SlurmError(
            f"`{name}` not found: SLURM's commands are not installed on this machine, or not "
            "on PATH\nHINT: run this on a machine of the SLURM cluster (a login or compute node), "
            "or install SLURM's clients (Debian: slurm-client) and point SLURM_CONF at the "
            "cluster's slurm.conf"
        )
    return path


def _run(
    argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run SLURM command ``argv``; a missing command or a hang becomes a SlurmError."""
    try:
        return subprocess.run(
            [command_path(argv[0], env), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"`{' '.join(argv)}` did not answer within {COMMAND_TIMEOUT_S:g}s\n"
            "HINT: slurmctld may be down or unreachable; check `scontrol ping`"
        ) from None


def _failed(done: subprocess.CompletedProcess[str], hint: str) -> SlurmError:
    argv = [os.path.basename(done.args[0]), *done.args[1:]]
    return SlurmError(
        f"`{' '.join(argv)}` failed (exit code {done.returncode}): {done.stderr.strip()}\nHINT: {hint}"
    )


def run_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Run SLURM command ``argv`` and return its stdout; a missing command, a failure or a
    hang becomes a SlurmError that says which command and what it printed."""
    done = _run(argv, env)
    if done.returncode != 0:
        raise _failed(done, _UNREACHABLE_HINT)
    return done.stdout


def expand_hostlist(hostlist: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """SLURM's node list (``n[1-2],gpu07``) as host names, in SLURM's order."""
    if not hostlist:
        return ()
    return tuple(run_command(["scontrol", "show", "hostnames", hostlist], env).split())


def node_addresses(nodes: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each node's address as SLURM reaches it (its ``NodeAddr``, which is the node's name
    where slurm.conf gives none): where a process on that node can be reached from the
    submitting machine and from the other nodes, even where node names do not resolve."""
    if not nodes:
        return {}
    out = run_command(["sinfo", "--noheader", "--Node", f"--nodes={','.join(nodes)}", "--format=%N %o"], env)
    found = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
    missing = [n for n in nodes if n not in found]
    if missing:
        raise SlurmError(
            f"SLURM does not know the address of node(s) {', '.join(missing)} (`sinfo --Node "
            "--format='%N %o'`)\nHINT: check the node names with `sinfo --Node`"
        )
    return {n: found[n] for n in nodes}


def allocation(env: Mapping[str, str] | None = None) -> Allocation:
    """The allocation this process runs in, from the variables SLURM sets in a batch script,
    a job step or an ``salloc`` shell."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        raise SlurmError(
            "not inside a SLURM allocation: SLURM_JOB_ID and SLURM_JOB_NODELIST are not set\n"
            "HINT: run this under sbatch, salloc or srun"
        )
    nodes = expand_hostlist(nodelist, env)
    count = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    if count is not None and int(count) != len(nodes):
        raise SlurmError(
            f"SLURM_JOB_NODELIST={nodelist} names {len(nodes)} nodes but SLURM_NNODES={count}\n"
            "HINT: these variables come from different allocations; do not set them by hand"
        )
    node_id = env.get("SLURM_NODEID")
    return Allocation(job_id, nodes, None if node_id is None else int(node_id))


def _number(value: Any) -> int | None:
    """An integer of either shape: a plain number (22.05) or ``{"set", "infinite", "number"}``
    (the ``*_no_val_struct`` of newer versions)."""
    if isinstance(value, Mapping):
        return int(value["number"]) if value.get("set") and not value.get("infinite") else None
    return None if value is None else int(value)


def _exit(value: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) from a job's ``exit_code``: a raw wait status in 22.05, an object
    ``{"status": [...], "return_code": ..., "signal": {"id": ...}}`` in newer versions."""
    if isinstance(value, Mapping):
        signal = _number(value.get("signal", {}).get("id"))
        return _number(value.get("return_code")), signal or None
    status = _number(value)
    if status is None:
        return None, None
    return (status >> 8) & 0xFF, (status & 0x7F) or None


def job_from_json(record: Mapping[str, Any]) -> SlurmJob:
    """One job of ``squeue --json``'s ``jobs`` list, of SLURM 22.05 or newer; ``nodes`` is
    left empty (``job`` expands ``nodelist``)."""
    words = record["job_state"]
    words = [words] if isinstance(words, str) else list(words)
    state = next((w for w in words if w in BASE_STATES), words[0])
    # 22.05 says 0 before the job ended; only an ended job has an exit code.
    exit_code, signal = _exit(record.get("exit_code")) if state in ENDED_STATES else (None, None)
    return SlurmJob(
        job_id=str(record["job_id"]),
        state=state,
        flags=tuple(w for w in words if w != state),
        nodelist=record.get("nodes") or "",
        reason=record.get("state_reason") or "",
        exit_code=exit_code,
        signal=signal,
        output=record.get("standard_output") or "",
        workdir=record.get("current_working_directory") or "",
    )


def job(job_id: str | int, env: Mapping[str, str] | None = None) -> SlurmJob:
    """Job ``job_id`` as SLURM sees it now. It is known while it is queued or running and for
    ``MinJobAge`` (300 s by default) after it ended; a SlurmError after that."""
    done = _run(["squeue", "--json", "--states=all", f"--jobs={job_id}"], env)
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        raise _failed(done, _UNREACHABLE_HINT)
    records = json.loads(done.stdout).get("jobs", []) if done.returncode == 0 else []
    for record in records:
        if str(record.get("job_id")) == str(job_id):
            found = job_from_json(record)
            return replace(found, nodes=expand_hostlist(found.nodelist, env))
    raise SlurmError(
        f"SLURM does not know job {job_id}\nHINT: a job is forgotten MinJobAge (300 s by "
        "default) after it ended; check the id, or the job's output file for how it ended"
    )


def wait_running(job_id: str | int, timeout: float, env: Mapping[str, str] | None = None) -> SlurmJob:
    """Wait until job ``job_id`` runs on its nodes and return it; SlurmJobEnded if it ends
    first, SlurmError at the deadline (the job is left as it is: the caller owns it)."""
    deadline = time.monotonic() + timeout
    while True:
        found = job(job_id, env)
        if found.state == "RUNNING" and "CONFIGURING" not in found.flags:
            return found
        if found.ended:
            if found.output:
                where = f"; its output is in {found.output}"
            else:  # SLURM 22.05 does not say; this is sbatch's default
                where = f"; its output is in {found.workdir}/slurm-{job_id}.out unless sbatch had --output"
            raise SlurmJobEnded(
                f"{found.describe()} before it ran as expected{where}\n"
                "HINT: read the job's output file; `scontrol show job "
                f"{job_id}` shows why SLURM ended it",
                found,
            )
        if time.monotonic() > deadline:
            raise SlurmError(
                f"{found.describe()} after {timeout:g}s of waiting for it to run\n"
                f"HINT: `squeue --jobs={job_id}` shows why it waits (the reason column); "
                "cancel it with `scancel` if it should not run"
            )
        time.sleep(POLL_INTERVAL_S)


def submit(sbatch_args: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """Submit a batch job (``sbatch --parsable`` with ``sbatch_args``: options, then a script
    and its arguments, or ``--wrap``) and return its id."""
    done = _run(["sbatch", "--parsable", *sbatch_args], env, cwd)
    if done.returncode != 0:
        raise _failed(done, "sbatch's message says what it rejected (an option, a partition, a limit)")
    # --parsable prints "<id>" or "<id>;<cluster>"
    return done.stdout.strip().split(";")[0]


def cancel(job_id: str | int, env: Mapping[str, str] | None = None, signal: str | None = None) -> None:
    """Cancel job (or step, ``<job>.<step>``) ``job_id``; with ``signal``, only send it that
    signal. Cancelling a job that already ended is not an error."""
    run_command(["scancel", *([f"--signal={signal}"] if signal else []), str(job_id)], env)
