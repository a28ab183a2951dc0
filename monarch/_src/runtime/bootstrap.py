"""Entry point of a worker process: ``python -m monarch._src.runtime.bootstrap``.

The spawner has already bound this worker's listening socket and passes it as an inherited
file descriptor, so peers can connect (and queue frames) before this interpreter has even
started; the job secret arrives through another inherited pipe. When its parent dies, however
it dies (``kill -9`` included; see ``parent_death``), the worker exits, and the last process of
the job to go removes the job's files, so nothing outlives its client.

The main thread stays free: it waits until the worker is asked to exit, or runs work that
must own the main thread (the launcher runs the user's training script there).
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from monarch._src.runtime import framework_log, parent_death
from monarch._src.runtime.runtime import Runtime

BOOTSTRAP_ENV = "MONARCH_BOOTSTRAP"
#: Seconds a worker waits for its own threads at exit before it exits anyway.
EXIT_GRACE_S = 3.0

#: Work for the main thread: callables, or an int exit code that ends the worker.
_main_queue: queue.SimpleQueue[Callable[[], Any] | int] = queue.SimpleQueue()


def request_exit(code: int = 0) -> None:
    _main_queue.put(code)


def run_on_main_thread(fn: Callable[[], Any]) -> None:
    """Run ``fn`` on this worker's main thread (e.g. a training script run as ``__main__``)."""
    _main_queue.put(fn)


def _leave_when_parent_dies(death_fd: int) -> None:
    """Watch from before the runtime exists: once it accepts frames, user code (a ``bootstrap``
    function) may run at any moment, and may leave no room for another thread."""

    def parent_died() -> None:
        try:
            rt = Runtime.current()
            if rt is not None:
                rt.leave_orphaned_job()
        finally:
            _exit_now(0)

    parent_death.call_on_parent_death(parent_died, death_fd)


def read_secret_fd(fd: int) -> bytes:
    """The job secret, from a pipe the spawner filled and closed (never the environment, which
    anyone who may read ``/proc/<pid>/environ`` can read)."""
    chunks = []
    while chunk := os.read(fd, 64):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _exit_now(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _line_buffered_output() -> None:
    """stdout/stderr are pipes read by the spawner: hand over every line as it is written."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(line_buffering=True)
            except Exception:
                pass


def main() -> None:
    config: dict[str, Any] = json.loads(os.environ.pop(BOOTSTRAP_ENV))
    secret = read_secret_fd(config["secret_fd"])
    _line_buffered_output()
    framework_log.setup_worker(str(config.get("name", "proc")), int(config.get("rank", 0)))
    # Upper layers name the modules that register their handlers (the runtime knows none).
    for module in config.get("init_modules", []):
        hook = getattr(importlib.import_module(module), "on_worker_start", None)
        if hook is not None:
            hook(config)
    _leave_when_parent_dies(config["death_fd"])
    listen = socket.socket(fileno=config["listen_fd"])
    rt = Runtime(secret=secret, socket_dir=config["socket_dir"], listen_sock=listen, idle_reads=True)
    while True:
        work = _main_queue.get()
        if isinstance(work, int):
            code = work
            break
        work()
    # Exit gracefully (interpreter finalization runs), but never hang on a stuck thread.
    timer = threading.Timer(EXIT_GRACE_S, _exit_now, args=(code,))
    timer.daemon = True
    timer.start()
    rt.shutdown()
    sys.exit(code)


if __name__ == "__main__":
    # Run the importable module's main, not this __main__ copy, so its state is shared.
    from monarch._src.runtime.bootstrap import main as _main

    _main()
