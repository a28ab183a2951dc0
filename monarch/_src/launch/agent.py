"""The launch controller: a ProcMesh of workers, watched, torn down and restarted.

One :class:`Agent` runs one launch (the command line, or one call of the library form)
on one node. For each attempt it

1. starts a fresh rendezvous store (:mod:`.store`) and computes torchrun's worker
   environment (:mod:`.worker_env`) with ``TORCHELASTIC_RESTART_COUNT`` = the attempt;
2. spawns the workers, ``this_host().spawn_procs(per_host={"gpus": nproc})``, and a
   :class:`~.worker.Runner` on them, owned by :class:`_MeshOwner`: an actor whose
   ``__supervise__`` accepts the failures of the meshes it owns, so that a worker exit is
   the launcher's business (restart or report) rather than the client's default fault
   hook (which would exit the process);
3. waits for events: a worker exited (the spawner's exit watch, within milliseconds, no
   polling), a function returned (library form), a signal reached the launcher, a timer
   (``--hang-timeout``);
4. on the first failure, sends SIGTERM to every other worker's process group, SIGKILL
   after ``--kill-grace-period`` seconds, and restarts the whole group with a new store
   (and a new port when the port was not fixed), or reports the failures in torchrun's
   format when no restarts are left.

In a multi-node job (``--nnodes`` above 1, one launcher per node) each attempt starts
with a round of the job's rendezvous (:mod:`.rendezvous`), which gives the ranks and the
workers' store; the end of a round is shared: a failure on any node, a lost node or a new
one stops every node's workers, and the job's restart budget decides what follows.

In single-controller mode (``--hosts``) this one launcher runs every node: the ranks are
spawned through the host agents of ``--hosts`` (``HostMesh.spawn_procs``), host ``i`` is
``GROUP_RANK`` ``i``, the workers' store is the launcher's own, and one attempt spans
every host, so a failure anywhere ends it everywhere and a restart restarts the whole job.
The attempt's slots are then the global ranks (``nproc_per_node`` per host, host-major).

The agent is plain Python driven by one thread (the command line's main thread, so that
signal handlers can post to it; a background thread in the library form).
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.errors import SupervisionError
from monarch._src.actor.future import Future, add_done_callback, outcome
from monarch._src.actor.proc_mesh import ProcOwner, owner_of, this_proc
from monarch._src.host.host_mesh import this_host
from monarch._src.mesh.extent import Extent
from monarch._src.mesh.shape import Shape
from monarch._src.mesh.value_mesh import ValueMesh
from monarch._src.runtime import output_writer

from . import stacks as stacks_module
from .command import EntryKind, WorkerCommand
from .config import LaunchConfig, Std
from .logs import RunDirs, Tailer, TailFile, line_prefix
from .preload import auto_preload
from .rendezvous import FAILURE_REASONS, JobRendezvous, RendezvousInterrupted, Round, RoundEnded, RoundWatch
from .store import StoreServer
from .store_client import StoreGone
from .summary import ChildFailedError, ProcessFailure, RankReport
from .worker import Runner, WorkerSpec, signal_process_group
from .worker_env import default_master_addr, error_file_path, worker_env_vars

__all__ = ["Agent", "Outcome", "Target", "signal_process_group"]

LABEL = "gpus"
#: The tee prefix in single-controller mode, unless TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is set.
HOSTS_LINE_PREFIX = "[${role_name}${rank}]:"
#: Bound on waiting for SIGKILLed workers to be reaped (D-state processes never are).
KILL_WAIT_S = 30.0
#: How often the agent wakes up without events while timers are armed.
TICK_S = 1.0
#: The longest the main thread blocks at once, so that a signal's handler runs this soon.
SIGNAL_POLL_S = 0.1


def _free_port(host: str) -> int:
    """torchrun's ``get_free_port`` probe (only for ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``)."""
    family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _peak_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fp:
            for line in fp:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _failure_record(failure: ProcessFailure) -> dict[str, Any]:
    """A failure as the other nodes' launchers get it (JSON, through the store)."""
    return {
        "rank": failure.rank,
        "local_rank": failure.local_rank,
        "pid": failure.pid,
        "exitcode": failure.exitcode,
        "message": failure.traceback_text(),
        "timestamp": failure.timestamp,
    }


# -- ownership of the worker meshes ---------------------------------------------------------------


class _MeshOwner(Actor):
    """Spawns the Runner meshes, so that their failures come here (and are accepted)."""

    @endpoint
    def spawn_runner(self, procs: Any) -> Any:
        return procs.spawn("launch_runner", Runner)

    def __supervise__(self, failure: Any) -> bool:
        # Worker exits are handled by the agent from the exit status; accepting the
        # failure here keeps the client's fault hook out of it.
        return True


_owner: Any = None
_owner_lock = threading.Lock()


def _mesh_owner() -> Any:
    global _owner
    with _owner_lock:
        if _owner is None:
            _owner = this_proc().spawn("monarch_launch_owner", _MeshOwner)
        return _owner


# -- data -------------------------------------------------------------------------------------------


@dataclass
class Target:
    """What each rank runs: a command (script mode) or a function (library form)."""

    command: WorkerCommand | None = None
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    @property
    def is_call(self) -> bool:
        return self.command is None


@dataclass
class Outcome:
    """How a launch ended.

    :param state: ``"succeeded"``, ``"failed"`` or ``"signaled"``.
    :param values: per-rank results of the last attempt (exit codes, or return values).
    :param error: the torchrun-style failure, when ``state == "failed"``.
    :param cause: the root cause's own exception (library form), if any.
    :param signum: the signal that stopped the launch, when ``state == "signaled"``.
    """

    state: str
    attempts: int
    values: list[Any] | None = None
    error: ChildFailedError | None = None
    cause: BaseException | None = None
    signum: int | None = None
    reports: list[RankReport] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 0 if self.state == "succeeded" else 1

    def value_mesh(self) -> ValueMesh[Any]:
        values = self.values or []
        return ValueMesh(Shape.from_extent(Extent([LABEL], [len(values)])), values)


# -- what the agent's thread waits for ------------------------------------------------------------


@dataclass(frozen=True)
class SignalReceived:
    """A signal reached the launcher (posted from its handler)."""

    signum: int


@dataclass(frozen=True)
class DumpRequested:
    """Print every rank's stacks (SIGUSR1, or ``--hang-timeout``)."""

    reason: str


@dataclass(frozen=True)
class WorkerExited:
    """Worker ``rank`` of attempt ``attempt`` exited with ``code`` (the spawner's exit watch)."""

    attempt: int
    rank: int
    code: int


@dataclass(frozen=True)
class FunctionReturned:
    """Library form: rank ``rank``'s function returned ``value`` or raised ``error``."""

    attempt: int
    rank: int
    value: Any
    error: BaseException | None


Event = SignalReceived | DumpRequested | WorkerExited | FunctionReturned | RoundEnded


class _Attempt:
    """One attempt's workers, by *slot*: the ranks this launcher runs (its node's local ranks,
    or every rank in single-controller mode)."""

    def __init__(
        self, index: int, nproc: int, rnd: Round | None = None, local_world: int | None = None
    ) -> None:
        self.index = index
        self.nproc = nproc
        #: ranks per node: slot ``i`` is local rank ``i % local_world`` of node ``i // local_world``.
        self.local_world = local_world or nproc
        #: the workers run on host agents' machines (single-controller mode): their pids are not
        #: this machine's, so they are signalled through their Runner.
        self.remote = False
        #: the multi-node rendezvous round this attempt runs in (None: a single-node job).
        self.round = rnd
        self.rank_offset = rnd.rank_offset if rnd is not None else 0
        self.watch: RoundWatch | None = None
        #: this node's workers all exited 0 and it waits for the other nodes'.
        self.local_done = False
        #: the job cannot go on (a launcher was stopped, the store is gone): no restart.
        self.terminal = False
        self.start = time.monotonic()
        self.procs: Any = None
        self.owner: ProcOwner | None = None
        self.runner: Any = None
        self.store: StoreServer | None = None
        self.pids: list[int] = [0] * nproc
        self.exit_codes: list[int | None] = [None] * nproc
        self.exit_times: list[float | None] = [None] * nproc
        self.results: dict[int, Any] = {}
        self.failures: dict[int, ProcessFailure] = {}
        self.causes: dict[int, BaseException] = {}
        self.error_files: list[str] = [""] * nproc
        self.stats_files: list[str | None] = [None] * nproc
        self.peak_rss: list[int | None] = [None] * nproc
        self.last_exit = self.start
        self.dumped_at: float | None = None
        self.next_sample = 0.0
        self.stopping = False

    def alive(self) -> list[bool]:
        return [c is None for c in self.exit_codes]

    def local_rank(self, slot: int) -> int:
        return slot % self.local_world

    def node(self, slot: int) -> int:
        """The group rank of the node that runs ``slot``."""
        base = self.round.group_rank if self.round is not None else 0
        return base + slot // self.local_world


class Agent:
    """Runs a launch to its end; see the module docstring.

    :param config: the validated configuration (``--nproc-per-node``, restarts, logs ...).
    :param target: what every rank runs.
    :param launcher_env: the environment workers inherit (torchrun: its own ``os.environ``).
    :param log: where the launcher's messages go.
    """

    def __init__(
        self,
        config: LaunchConfig,
        target: Target,
        *,
        launcher_env: Mapping[str, str],
        log: logging.Logger,
    ) -> None:
        if target.is_call and config.hosts is not None:
            raise ValueError("the library form runs on this machine; hosts= (--hosts) needs a script")
        if target.is_call and not config.is_single_node:
            raise ValueError(
                f"the library form runs single-node jobs; --nnodes={config.min_nodes}:{config.max_nodes} "
                "needs one `python -m monarch.launch` per node running a script"
            )
        self.config = config
        self.target = target
        self.env = dict(launcher_env)
        self.log = log
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._pending_signal: int | None = None
        self.dirs: RunDirs | None = None
        self.tailer: Tailer | None = None
        self.attempt: _Attempt | None = None
        self.use_agent_store = self.env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1"
        #: the job's rendezvous with the other nodes' launchers (None: a single-node job).
        self.rdzv: JobRendezvous | None = None
        if not config.is_single_node:
            self.rdzv = JobRendezvous(config, log, self._host_worker_store)
        self._round_store: StoreServer | None = None
        #: single-controller mode: the hosts every attempt spawns its ranks on.
        self.hosts: Any = None
        #: their agents' addresses, by group rank (the failure summary's ``host``).
        self.host_names: list[str] = []
        if config.hosts is not None:
            from monarch._src.host.hosts_config import hosts_from_value

            from .slurm_env import SLURM_HOSTS, listen_for_nodes

            if config.hosts == SLURM_HOSTS:
                listen_for_nodes(config.local_addr, self.env)
            self.hosts = hosts_from_value(config.hosts, "--hosts")  # attaches in the background
            self.host_names = self.hosts.agent_addresses

    # -- events from other threads (and signal handlers) ------------------------------------------

    def post(self, event: Event) -> None:
        """Thread-safe and safe in a signal handler."""
        self._events.put(event)

    def signal(self, signum: int) -> None:
        if self.rdzv is not None:
            self.rdzv.interrupt(signum)  # the main thread may be waiting for the other nodes
        self.post(SignalReceived(signum))

    def dump_stacks(self, reason: str = "SIGUSR1") -> None:
        self.post(DumpRequested(reason))

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> Outcome:
        config = self.config
        self.dirs = RunDirs(config.log_dir, config.rdzv_id)
        if self.dirs.private and any(config.file_streams(lr) for lr in range(config.nproc_per_node)):
            self.log.warning(
                "-r/-t without --log-dir: worker log files are written to %s and deleted when the "
                "run ends; pass --log-dir to keep them",
                self.dirs.run_dir,
            )
        self.tailer = Tailer()
        try:
            if self.hosts is not None:
                self._wait_for_hosts()
            return self._run_attempts()
        except RendezvousInterrupted as stop:
            self.log.warning("Received %s death signal while waiting for the other nodes", stop.signum)
            return Outcome("signaled", 0, signum=stop.signum)
        finally:
            if self.rdzv is not None:
                self.rdzv.close()
            if self.tailer is not None:
                self.tailer.stop()
            if self.hosts is not None:
                self._release_hosts()
            output_writer.flush_all(2.0)
            if self.dirs is not None:
                self.dirs.cleanup()

    def _run_attempts(self) -> Outcome:
        config = self.config
        if self.rdzv is not None:
            self.rdzv.open()
        attempt_index = 0
        while True:
            rnd = self._rendezvous()
            state = self._run_attempt(attempt_index, rnd)
            a = self.attempt
            assert a is not None
            reports = self._reports(a)
            if state == "succeeded":
                values: list[Any]
                if self.target.is_call:
                    values = [a.results[r] for r in range(a.nproc)]
                else:
                    values = list(a.exit_codes)
                return Outcome("succeeded", attempt_index + 1, values=values, reports=reports)
            if state == "signaled":
                return Outcome("signaled", attempt_index + 1, signum=self._pending_signal, reports=reports)
            if state == "rejoin":
                self.log.info("[%s] a new node joined; will restart worker group", config.role)
                attempt_index += 1
                continue
            remaining = config.max_restarts - (rnd.restart_count if rnd is not None else attempt_index)
            if remaining > 0 and not a.terminal:
                self.log.info(
                    "[%s] Worker group FAILED. %s/%s attempts left; will restart worker group",
                    config.role,
                    remaining,
                    config.max_restarts,
                )
                attempt_index += 1
                continue
            error = ChildFailedError(self.target.name, dict(a.failures))
            root_rank, _ = error.get_first_failure()
            return Outcome(
                "failed",
                attempt_index + 1,
                error=error,
                cause=a.causes.get(root_rank),
                reports=reports,
            )

    def _wait_for_hosts(self) -> None:
        """Every host's agent started a session for this launcher, or a clear error."""
        from monarch._src.runtime.config import CONFIG

        try:
            self.hosts.initialized.get(timeout=CONFIG.host_attach_timeout_s + 5.0)
        except TimeoutError as err:
            raise RuntimeError(
                f"--hosts {self.config.hosts}: the host agents did not all answer within "
                f"{CONFIG.host_attach_timeout_s + 5.0:.0f} s\n"
                "HINT: check that `python -m monarch.host` runs at each address"
            ) from err

    def _release_hosts(self) -> None:
        """End this launcher's sessions on the hosts (and, for ``local:N``, the agents)."""
        try:
            self.hosts.shutdown().get(timeout=10.0)
        except Exception as err:  # the run's outcome stands; the agents' own watch cleans up
            self.log.warning("could not release the hosts of --hosts: %s", err)

    def _rendezvous(self) -> Round | None:
        """The next round of a multi-node job (logged like torchrun's result), else None."""
        if self.rdzv is None:
            return None
        self.log.info("[%s] Rendezvous'ing worker group", self.config.role)
        rnd = self.rdzv.next_round()
        self.log.info(
            "[%s] Rendezvous complete for workers. Result: round=%s restart_count=%s master_addr=%s "
            "master_port=%s group_rank=%s group_world_size=%s global_ranks=%s world_size=%s",
            self.config.role,
            rnd.index,
            rnd.restart_count,
            rnd.master_addr,
            rnd.master_port,
            rnd.group_rank,
            rnd.group_world_size,
            list(range(rnd.rank_offset, rnd.rank_offset + self.config.nproc_per_node)),
            rnd.world_size,
        )
        return rnd

    # -- one attempt ------------------------------------------------------------------------------

    def _run_attempt(self, index: int, rnd: Round | None) -> str:
        ok = False
        try:
            a = self._start_attempt(index, rnd)
            state = self._watch(a)
            ok = True
            return state
        finally:
            current = self.attempt  # set even when _start_attempt failed part-way
            if current is not None and current.index == index:
                current.stopping = True
                if current.watch is not None:
                    current.watch.stop()
                if not ok and current.owner is not None:
                    current.owner.kill()  # the launcher itself failed: leave no worker behind
                if current.store is not None:
                    current.store.close()
            if self.tailer is not None:
                self.tailer.reset()

    def _host_worker_store(self) -> tuple[str, int]:
        """The workers' store of a c10d round on its group rank 0 (see :class:`JobRendezvous`)."""
        master_addr = default_master_addr(self.config)
        if not self.use_agent_store:
            return master_addr, _free_port(master_addr)
        self._round_store = StoreServer(master_addr, 0).start()
        return master_addr, self._round_store.port

    def _start_attempt(self, index: int, rnd: Round | None) -> _Attempt:
        config = self.config
        local_world = config.nproc_per_node
        nodes = len(self.host_names) if self.hosts is not None else 1
        nproc = nodes * local_world
        a = _Attempt(index, nproc, rnd, local_world)
        a.remote = self.hosts is not None
        self.attempt = a
        assert self.dirs is not None and self.tailer is not None
        attempt_dir = self.dirs.attempt_dir(index, nproc)

        # The rendezvous: a fresh store per attempt (torchrun reuses a stale one).
        layout: dict[str, Any] = {}
        if rnd is not None:
            # The rendezvous started the workers' store (and the static one is emptied).
            master_addr, master_port = rnd.master_addr, rnd.master_port
            a.store, self._round_store = self._round_store, None
            layout = dict(
                node_rank=rnd.group_rank,
                restart_count=rnd.restart_count,
                group_world_size=rnd.group_world_size,
                rank_offset=rnd.rank_offset,
                world_size=rnd.world_size,
                role_rank_offset=rnd.role_rank_offset,
                role_world_size=rnd.role_world_size,
            )
        else:
            if config.rdzv_backend == "static":
                master_addr, port = config.master_addr, config.master_port
            else:
                master_addr, port = default_master_addr(config), 0
            if self.use_agent_store:
                a.store = StoreServer(master_addr, port).start()
                master_port = a.store.port
            else:
                master_port = port or _free_port(master_addr)
            layout = dict(restart_count=index, group_world_size=nodes)

        hang = config.hang_timeout is not None
        scratch = self.dirs.scratch() if (hang or config.summary) else ""
        envs: list[dict[str, str]] = []
        specs: list[WorkerSpec] = []
        for lr in range(nproc):  # slots: local ranks, or global ranks with --hosts
            error_file = error_file_path(config, attempt_dir, lr)
            a.error_files[lr] = error_file
            env = dict(self.env)
            if rnd is None:
                layout["node_rank"] = a.node(lr)
            env.update(
                worker_env_vars(
                    config,
                    a.local_rank(lr),
                    master_addr=master_addr,
                    master_port=master_port,
                    error_file=error_file,
                    run_id=config.rdzv_id,
                    use_agent_store=self.use_agent_store,
                    parent_env=self.env,
                    **layout,
                )
            )
            envs.append(env)
            out, err = self._stream_targets(a, lr, attempt_dir, scratch)
            if config.summary:
                a.stats_files[lr] = os.path.join(scratch, f"attempt_{index}_rank{lr}.rss")
            specs.append(
                WorkerSpec(
                    rank=lr,
                    env=env,
                    stdout=out,
                    stderr=err,
                    command=self.target.command,
                    fn=self.target.fn,
                    args=self.target.args,
                    kwargs=self.target.kwargs,
                    error_file=error_file,
                    stats_file=a.stats_files[lr],
                )
            )
        if not self.dirs.disabled:
            for needles, name in (
                (config.duplicate_stdout_filters, "filtered_stdout.log"),
                (config.duplicate_stderr_filters, "filtered_stderr.log"),
            ):
                if needles:
                    open(os.path.join(attempt_dir, name), "ab").close()

        a.start = a.last_exit = time.monotonic()
        hosts = self.hosts if self.hosts is not None else this_host()
        a.procs = hosts.spawn_procs(
            per_host={LABEL: local_world},
            env=lambda point: envs[point.rank],
            name=f"launch{index}",
            preload=self._preload(envs),
        ).flatten(LABEL)  # {"hosts": H, "gpus": n} -> {"gpus": H * n}: one slot per rank
        a.owner = owner = owner_of(a.procs)
        assert owner is not None  # spawned here, so owned here
        a.pids = owner.pids
        owner.watch_exits(lambda rank, code: self.post(WorkerExited(index, rank, code)))
        a.runner = _mesh_owner().spawn_runner.call_one(a.procs).get(timeout=60)
        for lr, spec in enumerate(specs):
            one = a.runner.slice(**{LABEL: lr})
            if self.target.is_call:
                fut = one.run.call_one(spec)
                add_done_callback(fut, functools.partial(self._on_result, index, lr))
            else:
                one.run.broadcast(spec)
        if self.rdzv is not None and rnd is not None:
            a.watch = self.rdzv.watch(rnd, self.post)
        return a

    def _preload(self, envs: list[dict[str, str]]) -> tuple[str, ...]:
        """``--preload``: the modules given, or by default torch when that is safe (.preload)."""
        if not self.config.preload_auto:
            return self.config.preload
        modules, why = auto_preload(self.target.command, envs)
        self.log.debug("--preload auto: %s (%s)", ",".join(modules) or "nothing", why)
        return modules

    def _stream_targets(
        self, a: _Attempt, slot: int, attempt_dir: str, scratch: str
    ) -> tuple[str | None, str | None]:
        """Where fd 1 and fd 2 of ``slot`` point, and what the tailer watches.

        The files are ``attempt_<n>/<slot>/``: by local rank, or by global rank with
        ``--hosts`` (whose prefix then names the global rank: local ranks repeat across hosts).
        """
        config = self.config
        assert self.tailer is not None and self.dirs is not None
        local_rank, index = a.local_rank(slot), a.index
        files = config.file_streams(local_rank) if not self.dirs.disabled else Std.NONE
        tee = config.tee.get(local_rank, Std.NONE) if not self.dirs.disabled else Std.NONE
        visible = config.console_visible(local_rank)
        hang = config.hang_timeout is not None
        template = config.log_line_prefix_template
        if template is None and self.hosts is not None:
            template = HOSTS_LINE_PREFIX
        prefix = line_prefix(template, config.role, a.rank_offset + slot, local_rank)
        targets: list[str | None] = []
        for bit, name, console, needles in (
            (Std.OUT, "stdout", "stdout", config.duplicate_stdout_filters),
            (Std.ERR, "stderr", "stderr", config.duplicate_stderr_filters),
        ):
            if files & bit:
                path = os.path.join(attempt_dir, str(slot), f"{name}.log")
                open(path, "wb").close()
                teed = bool(tee & bit) and visible
                if teed or hang:
                    dup = os.path.join(attempt_dir, f"filtered_{name}.log") if (teed and needles) else None
                    self.tailer.add(
                        TailFile(path, slot, prefix if teed else None, console, dup, tuple(needles))
                    )
                targets.append(path)
            elif hang:
                # Console output goes through a private file, so that the launcher sees
                # when a rank last printed.
                path = os.path.join(scratch, f"attempt_{index}_rank{slot}.{name}")
                open(path, "wb").close()
                self.tailer.add(TailFile(path, slot, "" if visible else None, console))
                targets.append(path)
            elif not visible:
                targets.append(os.devnull)
            else:
                targets.append(None)
        return targets[0], targets[1]

    # -- watching -----------------------------------------------------------------------------------

    def _on_result(self, index: int, rank: int, fut: Future[Any]) -> None:
        value, error = outcome(fut)
        self.post(FunctionReturned(index, rank, value, error))

    def _watch(self, a: _Attempt) -> str:
        while True:
            event = self._next_event(a)
            if event is None:
                continue
            if isinstance(event, SignalReceived):
                self._end_round(a, {"reason": "stopped", "signum": event.signum})
                return self._shutdown_on_signal(a, event.signum)
            if isinstance(event, DumpRequested):
                self._dump(a, event.reason)
                continue
            if isinstance(event, RoundEnded):
                if a.round is not None and event.index == a.round.index:
                    return self._on_round_ended(a, event)
                continue
            if isinstance(event, WorkerExited) and event.attempt == a.index:
                rank, code = event.rank, event.code
                if not self._record_exit(a, rank, code):
                    continue
                if code != 0 or self.target.is_call:
                    failure = self._add_failure(a, rank, code)
                    self._end_round(a, {"reason": "failed", "failures": [_failure_record(failure)]})
                    return self._shutdown_on_failure(a)
                if all(c is not None for c in a.exit_codes):
                    if self.rdzv is None or a.round is None:
                        return "succeeded"
                    a.local_done = True  # the job succeeds when every node's workers did
                    try:
                        self.rdzv.report_success(a.round)
                    except StoreGone:
                        pass  # the round's watch reports the lost store

            elif isinstance(event, FunctionReturned) and event.attempt == a.index:
                if event.error is None:
                    a.results[event.rank] = event.value
                    if len(a.results) == a.nproc:
                        self._stop_gracefully(a)
                        return "succeeded"
                elif not isinstance(event.error, SupervisionError):
                    self._add_failure(a, event.rank, 1, cause=event.error)
                    return self._shutdown_on_failure(a)
                # else: the process died; its exit event (with the status) follows.

    def _next_event(self, a: _Attempt) -> Event | None:
        # Never block without a bound: a signal that the kernel hands to another thread only
        # sets a flag, and its Python handler runs once the main thread executes bytecode.
        timers = self._timers(a)
        timeout = SIGNAL_POLL_S if timers is None else min(timers, SIGNAL_POLL_S)
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def _timers(self, a: _Attempt) -> float | None:
        """Run due timers; the seconds until the next one (None: no timer armed)."""
        now = time.monotonic()
        waits: list[float] = []
        config = self.config
        if config.summary:
            if now >= a.next_sample:
                self._sample_rss(a)
                a.next_sample = now + TICK_S
            waits.append(a.next_sample - now)
        if config.hang_timeout is not None and not a.stopping:
            tail_activity = self.tailer.last_activity if self.tailer is not None else 0.0
            last = max(a.last_exit, tail_activity, a.start)
            due = last + config.hang_timeout
            if a.dumped_at == last:
                waits.append(TICK_S)  # dumped for this silence; look for activity again
            elif now >= due:
                a.dumped_at = last
                self.log.warning(
                    "no rank printed anything or exited for %.1f s (--hang-timeout); dumping the stacks "
                    "of every rank",
                    now - last,
                )
                self._dump(a, f"nothing printed or exited for {now - last:.1f} s")
                waits.append(TICK_S)
            else:
                waits.append(min(TICK_S, due - now))
        return max(0.0, min(waits)) if waits else None

    def _sample_rss(self, a: _Attempt) -> None:
        if a.remote:
            return  # other machines' pids (the workers report their peak at exit)
        for lr, pid in enumerate(a.pids):
            if a.exit_codes[lr] is None:
                value = _peak_rss_kib(pid)
                if value is not None:
                    a.peak_rss[lr] = max(value, a.peak_rss[lr] or 0)

    def _record_exit(self, a: _Attempt, rank: int, code: int) -> bool:
        if a.exit_codes[rank] is not None:
            return False
        a.exit_codes[rank] = code
        a.exit_times[rank] = a.last_exit = time.monotonic()
        if self.tailer is not None:
            self.tailer.finish_rank(rank)
        return True

    def _add_failure(
        self, a: _Attempt, slot: int, code: int, cause: BaseException | None = None
    ) -> ProcessFailure:
        rank = a.rank_offset + slot
        if rank in a.failures:
            return a.failures[rank]
        message = None
        if cause is not None:
            a.causes[rank] = getattr(cause, "exception", None) or cause
            message = getattr(cause, "exception_formatted", None) or f"{type(cause).__name__}: {cause}"
            message = message.rstrip("\n").replace("\n", "\n  ")
        elif self.target.is_call and code == 0:
            message = "the worker exited before the function returned"
        a.failures[rank] = failure = ProcessFailure(
            local_rank=a.local_rank(slot),
            rank=rank,
            pid=a.pids[slot],
            exitcode=code,
            error_file=a.error_files[slot],
            message=message,
            host=self.host_names[a.node(slot)] if self.hosts is not None else "",
            node=a.node(slot) if (a.round is not None or self.hosts is not None) else None,
        )
        return failure

    # -- the other nodes (multi-node jobs) ----------------------------------------------------------

    def _end_round(self, a: _Attempt, record: dict[str, Any]) -> None:
        """Tell every node how this round ended (the first to say so wins), naming this node."""
        if self.rdzv is None or a.round is None:
            return
        me = a.round.nodes[a.round.group_rank]
        record = {**record, "node": a.round.group_rank, "host": me.host, "pid": me.pid}
        try:
            self.rdzv.end_round(a.round.index, record)
        except StoreGone as err:
            self.log.error("could not tell the other nodes: %s", err)

    def _on_round_ended(self, a: _Attempt, event: RoundEnded) -> str:
        """Another node ended the round: stop this node's workers and say why."""
        assert a.round is not None
        record, reason = event.record, event.reason
        if reason == "succeeded":
            return "succeeded"
        if reason == "joined":
            self._stop_workers(a, signal.SIGTERM, self.config.kill_grace_period)
            return "rejoin"
        node = record.get("node")
        host = str(record.get("host", ""))
        if reason == "failed":
            for f in record.get("failures", []):
                a.failures[f["rank"]] = ProcessFailure(
                    local_rank=f["local_rank"],
                    rank=f["rank"],
                    pid=f["pid"],
                    exitcode=f["exitcode"],
                    message=f["message"],
                    detected=f["timestamp"],
                    host=host,
                    node=node,
                )
        else:
            a.terminal = reason not in FAILURE_REASONS
            if reason == "node_lost":
                message = (
                    f"the launcher of node {node} (pid {record.get('pid')}) sent no heartbeat for "
                    f"{record.get('seconds')} s: it was killed or its host is gone"
                )
            elif reason == "stopped":
                message = f"the launcher of node {node} was stopped by signal {record.get('signum')}"
            else:
                message = str(record.get("detail", reason))
            first_rank = a.round.offset_of(node) if isinstance(node, int) else -1
            a.failures[first_rank] = ProcessFailure(
                local_rank=0 if isinstance(node, int) else -1,
                rank=first_rank,
                pid=int(record.get("pid", 0)),
                exitcode=1,
                message=message,
                host=host or (self.rdzv.store_host if self.rdzv else ""),
                node=node,
            )
        self.log.error("node %s (%s) ended the job's round %s: %s", node, host, a.round.index, reason)
        self._stop_workers(a, signal.SIGTERM, self.config.kill_grace_period)
        return "failed"

    def _dump(self, a: _Attempt, reason: str) -> None:
        if a.runner is None:
            return
        ranks = list(range(a.nproc))
        text = stacks_module.collect_stacks(a.runner, ranks, a.alive(), LABEL)
        stacks_module.print_stacks(text, reason)

    # -- stopping -----------------------------------------------------------------------------------

    def _stop_workers(self, a: _Attempt, sig: int, grace: float) -> None:
        """``sig`` to every live worker's process group; SIGKILL after ``grace`` seconds."""
        a.stopping = True
        self._sample_rss(a)
        sig_name = signal.Signals(sig).name
        for lr, code in enumerate(a.exit_codes):
            if code is None:
                self.log.warning("Sending process %s closing signal %s", a.pids[lr], sig_name)
                self._signal_worker(a, lr, sig)
        if self._wait_for_exits(a, time.monotonic() + grace, escalate=True):
            return
        for lr, code in enumerate(a.exit_codes):
            if code is None:
                self.log.warning(
                    "Unable to shutdown process %s via %s, forcefully exiting via %s",
                    a.pids[lr],
                    sig_name,
                    signal.SIGKILL.name,
                )
                self._signal_worker(a, lr, signal.SIGKILL)
        if not self._wait_for_exits(a, time.monotonic() + KILL_WAIT_S, escalate=False):
            self.log.error(
                "some workers did not exit after SIGKILL: %s",
                [a.pids[i] for i, c in enumerate(a.exit_codes) if c is None],
            )

    def _signal_worker(self, a: _Attempt, slot: int, sig: int) -> None:
        """``sig`` to the worker's process group: directly on this machine; on a host agent's
        machine the worker sends it to itself (SIGKILL: its host's session kills it)."""
        if not a.remote:
            signal_process_group(a.pids[slot], sig)
        elif sig == signal.SIGKILL or a.runner is None:
            if sig == signal.SIGKILL and a.owner is not None:
                a.owner.kill()  # every live worker of the attempt, on every host
        else:
            try:
                a.runner.slice(**{LABEL: slot}).signal_group.broadcast(sig)
            except SupervisionError:  # its host was lost: the worker is gone, its exit reported
                pass

    def _wait_for_exits(self, a: _Attempt, deadline: float, escalate: bool) -> bool:
        """Process events until every worker exited (True) or ``deadline`` (False).

        A signal to the launcher meanwhile is remembered; with ``escalate`` it also cuts
        the grace period short (a second Ctrl-C kills at once).
        """
        while any(c is None for c in a.exit_codes):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                event = self._events.get(timeout=min(left, TICK_S))
            except queue.Empty:
                continue
            if isinstance(event, WorkerExited) and event.attempt == a.index:
                self._record_exit(a, event.rank, event.code)
            elif isinstance(event, SignalReceived):
                if self._pending_signal is None:
                    self._pending_signal = event.signum
                if escalate:
                    return False  # a signal while we wait politely: kill now
            elif isinstance(event, DumpRequested):
                self._dump(a, event.reason)
        return True

    def _shutdown_on_failure(self, a: _Attempt) -> str:
        self._stop_workers(a, signal.SIGTERM, self.config.kill_grace_period)
        # Workers stopped by the teardown are failures too, in local-rank order (torchrun's).
        for lr, code in enumerate(a.exit_codes):
            if code is not None and code != 0 and a.rank_offset + lr not in a.failures:
                self._add_failure(a, lr, code)
        root = min(a.failures.values(), key=lambda f: f.timestamp)
        command = self.target.command
        if command is not None and command.kind is EntryKind.RUN_PATH:
            # torchrun's --run-path (multiprocessing) reports only the first failure.
            a.failures = {root.rank: root}
        self.log.error(
            "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s",
            root.exitcode,
            root.local_rank,
            root.pid,
            self.target.command.binary if self.target.command is not None else self.target.name,
        )
        if self._pending_signal is not None:
            return "signaled"
        return "failed"

    def _shutdown_on_signal(self, a: _Attempt, signum: int) -> str:
        self.log.warning("Received %s death signal, shutting down workers", signum)
        self._pending_signal = None  # a second signal while we wait kills the workers at once
        self._stop_workers(a, signum, self.config.shutdown_timeout)
        self._pending_signal = signum
        return "signaled"

    def _stop_gracefully(self, a: _Attempt) -> None:
        """Library form: every function returned; stop the workers (they idle)."""
        a.stopping = True
        self._sample_rss(a)
        try:
            a.procs.stop().get(timeout=15)
        except Exception:
            pass
        self._wait_for_exits(a, time.monotonic() + 5.0, escalate=False)

    # -- reports ------------------------------------------------------------------------------------

    def _reports(self, a: _Attempt) -> list[RankReport]:
        out = []
        for lr in range(a.nproc):
            peak = a.peak_rss[lr]
            path = a.stats_files[lr]
            if path:
                try:
                    with open(path) as fp:
                        peak = max(int(fp.read().strip() or 0), peak or 0)
                except (OSError, ValueError):
                    pass
            end = a.exit_times[lr]
            wall = (end if end is not None else time.monotonic()) - a.start
            out.append(
                RankReport(a.rank_offset + lr, a.local_rank(lr), a.pids[lr], a.exit_codes[lr], wall, peak)
            )
        return out
