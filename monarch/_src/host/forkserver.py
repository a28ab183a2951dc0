"""Workers forked from one template process that imported the heavy modules once.

``spawn_procs(..., preload=["torch"])``: instead of fork+exec of one interpreter per worker,
the spawner fork+execs one template (``python -m monarch._src.host.forkserver``) that imports
the ``preload`` modules and monarch's worker runtime, then forks every worker from itself. Four
workers that each import torch cost one torch import instead of four, which is what a 2-core
machine notices most.

Each forked worker is set up as a fork+exec'd one would be: its own session and process
group, its own stdout/stderr pipes, listening socket and parent-death pipe (the spawner
creates them all and hands them to the template), exactly its own environment, and fresh
random seeds (``random`` reseeds itself at fork; numpy's global generator and torch's CPU one
are reseeded here).
What differs, by design: the preloaded modules are already imported when the worker starts,
with the environment that all workers share (a variable a worker's script sets before
``import torch`` cannot change how torch initialized), and its parent is the template, which
reaps it and reports its pid and exit status to the spawner over a pipe (``ForkedProc``).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from monarch._src.runtime import parent_death

FORKSERVER_ENV = "MONARCH_FORKSERVER"
FORKSERVER_MODULE = "monarch._src.host.forkserver"
#: Modules every worker needs, imported by the template for all of them.
RUNTIME_MODULES = ["monarch._src.runtime.bootstrap", "monarch._src.actor.process_state", "cloudpickle"]


class ForkedProc:
    """A worker forked by the template, with the parts of ``Popen``'s interface the spawner
    uses; its pid and exit status arrive from the template's reports."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._started = threading.Event()
        self._exited = threading.Event()
        self.returncode: int | None = None
        self.on_exit: Callable[[], None] | None = None

    @property
    def pid(self) -> int:
        """The worker's pid, once the template forked it (it imports the preloads first);
        0 if the template died before forking it."""
        self._started.wait()
        return self._pid or 0

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"monarch worker {self._pid}", timeout or 0)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self._pid and self.returncode is None:
            try:
                os.kill(self._pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def _set_pid(self, pid: int) -> None:
        self._pid = pid
        self._started.set()

    def _set_exit(self, code: int) -> None:
        if self._exited.is_set():
            return
        self.returncode = code
        self._started.set()
        self._exited.set()
        if self.on_exit is not None:
            self.on_exit()


def start(
    ranks: Sequence[dict[str, Any]], preload: Sequence[str], env: dict[str, str], pass_fds: Sequence[int]
) -> tuple[subprocess.Popen[bytes], list[ForkedProc]]:
    """Start the template; it forks one worker per entry of ``ranks``.

    Each entry: ``env`` (the worker's whole environment), ``keep`` (fds the worker keeps,
    at the same numbers) and ``stdout``/``stderr`` (fds to become its 1 and 2, or None).
    ``env`` is the template's own environment: what all workers share.
    """
    status_r, status_w = os.pipe()
    config = {"preload": [*preload, *RUNTIME_MODULES], "ranks": list(ranks), "status_fd": status_w}
    try:
        template = subprocess.Popen(
            [sys.executable, "-m", FORKSERVER_MODULE],
            pass_fds=(*pass_fds, status_w),
            env={**env, FORKSERVER_ENV: json.dumps(config)},
            start_new_session=True,
        )
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    procs = [ForkedProc() for _ in ranks]
    reader = threading.Thread(
        target=_read_reports, args=(status_r, procs, template), name="monarch-forkserver", daemon=True
    )
    reader.start()
    return template, procs


def _read_reports(fd: int, procs: list[ForkedProc], template: subprocess.Popen[bytes]) -> None:
    """Apply the template's "pid RANK PID" and "exit RANK CODE" lines until it exits."""
    with os.fdopen(fd, "r") as reports:
        for line in reports:
            kind, rank, value = line.split()
            if kind == "pid":
                procs[int(rank)]._set_pid(int(value))
            elif kind == "exit":
                procs[int(rank)]._set_exit(int(value))
    template.wait()  # it closed the pipe: it is exiting
    # A worker it never reported on has no parent to report it now.
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            proc._set_exit(-9)


# -- the template process ---------------------------------------------------------------------


def _serve() -> dict[str, Any] | None:
    """Fork every worker. Returns the worker's entry in a worker, None in the template (after
    all its workers exited)."""
    config = json.loads(os.environ.pop(FORKSERVER_ENV))
    # The client died (this may still be preloading: seconds for torch): exit, and the workers
    # already forked, whose parent this is, notice and leave.
    stop_watching = parent_death.call_on_parent_death(_exit_now)
    for module in config["preload"]:
        try:
            importlib.import_module(module)
        except Exception as e:  # the worker's own import will fail, and say why
            print(f"[monarch] preloading {module} failed: {e!r}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    stop_watching()  # no thread may run while this forks
    ranks: list[dict[str, Any]] = config["ranks"]
    status_fd: int = config["status_fd"]
    every_fd = {fd for r in ranks for fd in (*r["keep"], r["stdout"], r["stderr"]) if fd is not None}
    children: dict[int, int] = {}
    for rank, spec in enumerate(ranks):
        pid = os.fork()
        if pid == 0:
            os.close(status_fd)
            _become(spec, every_fd)
            return spec
        children[pid] = rank
        _report(status_fd, f"pid {rank} {pid}\n")
    for fd in every_fd:
        os.close(fd)
    parent_death.call_on_parent_death(_exit_now)
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        rank = children.pop(pid, -1)
        if rank >= 0:
            _report(status_fd, f"exit {rank} {os.waitstatus_to_exitcode(status)}\n")
    return None


def _exit_now() -> None:
    os._exit(0)


def _report(fd: int, line: str) -> None:
    try:
        os.write(fd, line.encode())
    except OSError:  # the spawner is gone; its workers follow through their death pipes
        pass


def _become(spec: dict[str, Any], every_fd: set[int]) -> None:
    """Turn this fresh fork into the worker ``spec`` describes."""
    os.setsid()
    for target, fd in ((1, spec["stdout"]), (2, spec["stderr"])):
        if fd is not None:
            os.dup2(fd, target)
    keep = set(spec["keep"])
    for fd in every_fd - keep:
        os.close(fd)
    os.environ.clear()
    os.environ.update(spec["env"])
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # seeded at import, in the template: give each worker its own
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:  # likewise torch's CPU generator (its CUDA ones start from a fixed seed)
        torch.default_generator.seed()


if __name__ == "__main__":
    _spec = _serve()
    if _spec is not None:
        from monarch._src.runtime.bootstrap import main as _worker_main

        _worker_main()  # ends in sys.exit: the worker's interpreter exits as a worker's does
