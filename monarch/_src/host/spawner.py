"""Starting worker processes (fork+exec) and noticing when they exit.

Each worker gets its listening socket already bound (so messages can be sent to it the moment
``spawn_procs`` returns), the read end of a "parent alive" pipe and a pipe holding the job
secret. Exits are observed with a
pidfd on the event loop (a waiter thread where pidfds are unavailable), within milliseconds.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from monarch._src.actor import config as actor_config
from monarch._src.actor import supervision
from monarch._src.actor.future import Future, pending_future, set_result, when_all_done
from monarch._src.actor.log_forwarding import CAPTURE_ENV
from monarch._src.actor.process_state import runtime
from monarch._src.host import log_capture
from monarch._src.host.process_exit import when_process_exits
from monarch._src.runtime import framework_log
from monarch._src.runtime.bootstrap import BOOTSTRAP_ENV
from monarch._src.transport.address import of_listening_socket, remove_socket_file
from monarch._src.wire.protocol import stop_proc

logger = logging.getLogger("monarch.host")

WORKER_MODULE = "monarch._src.runtime.bootstrap"
INIT_MODULES = ["monarch._src.actor.process_state"]

_live_groups: weakref.WeakSet[ProcGroup] = weakref.WeakSet()
_groups_lock = threading.Lock()


def worker_pythonpath(existing: str | None) -> str:
    """The client's import path (absolute) followed by any PYTHONPATH already set."""
    paths = [os.path.abspath(p or os.curdir) for p in sys.path if not p.endswith(".zip")]
    paths = [p for p in paths if os.path.isdir(p)]
    if existing:
        paths.append(existing)
    return os.pathsep.join(dict.fromkeys(paths))  # in order, without duplicates


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (Killed(sig={-returncode}))"
    return f"exited with code {returncode}"


def secret_pipe(secret: bytes) -> int:
    """The read end of a pipe holding ``secret``: the worker reads it at start-up, so the secret
    never appears in any process's environment (``/proc/<pid>/environ``)."""
    r, w = os.pipe()
    try:
        os.write(w, secret)  # far below the pipe's capacity: never blocks
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


def worker_environment(
    extra_env: Mapping[str, str], root: str, bootstrap: dict[str, Any], captured: bool
) -> dict[str, str]:
    """The environment of a worker process: this process's, ``extra_env``, what the worker's
    bootstrap reads (``bootstrap``: its descriptors, socket directory, init modules...), and
    ``captured``: whether its stdout/stderr are pipes read by its spawner."""
    env = dict(os.environ)
    env.update(extra_env)
    env["MONARCH_ROOT_ADDRESS"] = root
    # Workers import what the client can: classes defined next to the script or in test
    # modules unpickle there by reference.
    env["PYTHONPATH"] = worker_pythonpath(env.get("PYTHONPATH"))
    log_dir = framework_log.log_dir()
    if log_dir is not None:
        env[framework_log.LOG_DIR_ENV] = log_dir
    env[actor_config.PREFIX_ENV] = "1" if actor_config.prefix_python_logs_with_actor else "0"
    if captured:
        env[CAPTURE_ENV] = "1"
    env[BOOTSTRAP_ENV] = json.dumps(bootstrap)
    return env


class _Launch:
    """What one worker is started with; the parent's ends of its pipes stay here."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        #: Where the worker listens (its socket is bound before it starts).
        self.address = ""
        self.env: dict[str, str] = {}
        self.listen_fd = self.death_r = self.death_w = self.secret_r = -1
        self.out_r = self.out_w = self.err_r = self.err_w = -1
        self.proc: Any = None

    def close_parent_side(self, keep_readers: bool) -> None:
        """Close the worker's ends here (it has its copies); with ``keep_readers`` False, the
        parent's too, and remove the worker's socket file (the start failed: nothing will
        listen there)."""
        mine = [self.listen_fd, self.death_r, self.secret_r, self.out_w, self.err_w]
        if not keep_readers:
            mine += [self.death_w, self.out_r, self.err_r]
        for fd in mine:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.listen_fd = self.death_r = self.secret_r = self.out_w = self.err_w = -1
        if not keep_readers:
            self.death_w = self.out_r = self.err_r = -1
            if self.address:
                remove_socket_file(self.address)


class ProcGroup:
    """The OS processes behind one ``spawn_procs`` call, owned by the spawning process."""

    def __init__(
        self,
        name: str,
        envs: Sequence[Mapping[str, str]],
        gated: bool = False,
        capture_output: bool = True,
        preload: Sequence[str] = (),
        output_to: str | None = None,
        listen_sockets: Sequence[socket.socket] | None = None,
    ) -> None:
        """``listen_sockets``: bound, listening sockets for the workers, by rank (a host
        session binds them ahead of time, so that its client knows their addresses at once);
        None: bound here."""
        rt = runtime()
        self.name = name
        #: Read the workers' stdout/stderr (log_capture); False: they inherit this process's.
        self.capture_output = capture_output
        #: Where captured output goes by default (a host agent's session sends it to the
        #: client); None: this process's own stdout/stderr.
        self.output_to = output_to
        self.captures: list[log_capture.OutputCapture | None] = []
        self.addresses: list[str] = []
        #: ``subprocess.Popen``s, or ``forkserver.ForkedProc``s with ``preload``.
        self.procs: list[Any] = []
        self.returncodes: list[int | None] = []
        self._death_pipes: list[int] = []
        self._stop_requested = False
        self._exit_futures: list[Future[int]] = []
        self.on_exit: list[Callable[[int, str, int], None]] = []
        root = os.environ.get("MONARCH_ROOT_ADDRESS") or rt.address
        #: The template process that forked the workers (``preload``), if any.
        self.template: subprocess.Popen[bytes] | None = None
        launches: list[_Launch] = []
        try:
            for rank, extra_env in enumerate(envs):
                sock = listen_sockets[rank] if listen_sockets else rt.new_listen_socket()
                launches.append(self._prepare(rt, rank, sock, extra_env, root, gated))
            if preload:
                self._fork_from_template(launches, preload)
            else:
                for launch in launches:
                    self._exec(launch)
            for launch in launches:
                self._started(rt, launch)
        except BaseException:
            for launch in launches:
                launch.close_parent_side(keep_readers=False)
            self.kill()
            raise
        with _groups_lock:
            _live_groups.add(self)
        # Kept alive by its watchers until every process exited, and by every handle of a mesh
        # on it: once it is collected, nothing can address its processes any more.
        weakref.finalize(self, supervision.forget_processes, tuple(self.addresses))
        if capture_output:
            log_capture.maybe_register_ipython_hook()

    def _prepare(
        self, rt: Any, rank: int, sock: socket.socket, extra_env: Mapping[str, str], root: str, gated: bool
    ) -> _Launch:
        """Take the worker's listening socket, make its pipes and environment; start nothing yet."""
        launch = _Launch(rank)
        try:
            launch.address = of_listening_socket(sock)
            launch.listen_fd = sock.detach()
            launch.death_r, launch.death_w = os.pipe()
            launch.secret_r = secret_pipe(rt.secret)
            if self.capture_output:
                launch.out_r, launch.out_w = log_capture.make_pipe()
                launch.err_r, launch.err_w = log_capture.make_pipe()
            launch.env = worker_environment(
                extra_env,
                root,
                {
                    "listen_fd": launch.listen_fd,
                    "death_fd": launch.death_r,
                    "secret_fd": launch.secret_r,
                    "socket_dir": rt.socket_dir,
                    "init_modules": INIT_MODULES,
                    "gated": gated,
                    "name": self.name,
                    "rank": rank,
                },
                captured=self.capture_output,
            )
        except BaseException:
            launch.close_parent_side(keep_readers=False)
            raise
        return launch

    def _exec(self, launch: _Launch) -> None:
        try:
            launch.proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE],
                pass_fds=(launch.listen_fd, launch.death_r, launch.secret_r),
                env=launch.env,
                stdout=launch.out_w if launch.out_w >= 0 else None,
                stderr=launch.err_w if launch.err_w >= 0 else None,
                # Its own process group: a terminal's Ctrl-C reaches the client only (which
                # decides), and a launcher can signal a worker together with its children.
                start_new_session=True,
            )
        finally:
            launch.close_parent_side(keep_readers=True)

    def _fork_from_template(self, launches: list[_Launch], preload: Sequence[str]) -> None:
        from monarch._src.host import forkserver

        envs = [launch.env for launch in launches]
        shared = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs[1:])}
        ranks: list[dict[str, Any]] = [
            {
                "env": launch.env,
                "keep": [launch.listen_fd, launch.death_r, launch.secret_r],
                "stdout": launch.out_w if launch.out_w >= 0 else None,
                "stderr": launch.err_w if launch.err_w >= 0 else None,
            }
            for launch in launches
        ]
        fds = [fd for r in ranks for fd in (*r["keep"], r["stdout"], r["stderr"]) if fd is not None]
        try:
            self.template, procs = forkserver.start(ranks, preload, shared, fds)
        finally:
            for launch in launches:
                launch.close_parent_side(keep_readers=True)
        for launch, proc in zip(launches, procs):
            launch.proc = proc

    def _started(self, rt: Any, launch: _Launch) -> None:
        rank = launch.rank
        if launch.out_r >= 0:
            capture = log_capture.OutputCapture(
                f"{self.name} rank {rank}", launch.out_r, launch.err_r, self.output_to
            )
            rt.loop_thread.call_soon(capture.start)
            self.captures.append(capture)
        else:
            self.captures.append(None)
        self.procs.append(launch.proc)
        address = launch.address
        self.addresses.append(address)
        supervision.locally_spawned.add(address)
        self.returncodes.append(None)
        self._death_pipes.append(launch.death_w)
        fut: Future[int] = pending_future()
        self._exit_futures.append(fut)
        self._watch(rank, launch.proc)

    def _watch(self, rank: int, proc: Any) -> None:
        rt = runtime()
        if not isinstance(proc, subprocess.Popen):  # forked by the template, which reports exits
            proc.on_exit = lambda: rt.loop.call_soon_threadsafe(self._exited, rank)
            if proc.returncode is not None:
                proc.on_exit()
            return
        when_process_exits(rt.loop, proc, lambda: self._exited(rank))

    def _exited(self, rank: int) -> None:
        capture = self.captures[rank]
        if capture is None:
            self._report_exit(rank)
            return
        # Show what the worker wrote before it died ahead of the failure report.
        capture.drain_now()
        log_capture.after_output_written(lambda: self._report_exit(rank))

    def _report_exit(self, rank: int) -> None:
        proc = self.procs[rank]
        code = proc.wait()
        self.returncodes[rank] = code
        try:
            os.close(self._death_pipes[rank])
        except OSError:
            pass
        address = self.addresses[rank]
        # A worker removes its socket file as it exits, unless it was killed or crashed.
        remove_socket_file(address)
        how = describe_exit(code)
        # After a requested stop the actors have reported themselves stopped, so this only
        # fails what still waits on the process.
        supervision.process_exited(
            address, f"process {rank} of {self.name} {how}", expected=self._stop_requested
        )
        for cb in list(self.on_exit):
            try:
                cb(rank, how, code)
            except Exception:
                logger.exception("exit callback failed")
        set_result(self._exit_futures[rank], code)

    def watch_exits(self, callback: Callable[[int, str, int], None]) -> None:
        """``callback(rank, how, code)`` for every exit from now on, and at once for the procs
        that exited before it was in place (their ``how`` is ``"exited"``)."""
        self.on_exit.append(callback)
        for rank, code in enumerate(list(self.returncodes)):
            if code is not None:
                callback(rank, "exited", code)

    @property
    def stopped(self) -> bool:
        return self._stop_requested

    def alive(self) -> list[bool]:
        return [c is None for c in self.returncodes]

    def stop(self, reason: str = "stopped", timeout: float = 5.0) -> Future[None]:
        """Ask each worker to exit; kill those still running after ``timeout`` seconds."""
        self._stop_requested = True
        rt = runtime()
        for address, code in zip(self.addresses, self.returncodes):
            if code is None:
                try:
                    rt.send(address, stop_proc(), [])
                except Exception:
                    pass
        return when_all_done(list(self._exit_futures), timeout, self.kill)

    def kill(self) -> None:
        self._stop_requested = True
        if self.template is not None and self.template.poll() is None:
            self.template.kill()  # first: a template still preloading must fork nothing more
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.kill()
                except OSError:
                    pass

    def wait(self, timeout: float | None = None) -> None:
        reap(self.procs, timeout)


def reap(procs: Sequence[Any], timeout: float | None) -> None:
    """Wait up to ``timeout`` seconds for each of ``procs`` to exit; kill those that do not."""
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def live_worker_addresses() -> list[str]:
    """Addresses of the running workers whose output this process reads."""
    with _groups_lock:
        groups = list(_live_groups)
    return [
        address
        for g in groups
        for address, code, capture in zip(g.addresses, g.returncodes, g.captures)
        if code is None and capture is not None and not g.stopped
    ]


log_capture.worker_address_sources.append(live_worker_addresses)


def flush_worker_output(timeout: float = log_capture.FLUSH_BARRIER_TIMEOUT_S) -> bool:
    """Make everything the running workers printed so far visible here (bounded wait)."""
    return log_capture.flush_barrier(log_capture.live_worker_addresses(), timeout)


def stop_all_groups(timeout: float) -> None:
    """Stop every process group this process spawned (client shutdown)."""
    with _groups_lock:
        groups = list(_live_groups)
    futures = [g.stop("shutdown", timeout) for g in groups]
    for f in futures:
        try:
            f.get(timeout + 1.0)
        except Exception:
            pass
    for g in groups:
        g.kill()
        g.wait(1.0)
