"""Noticing that this process's parent died, however it died (``kill -9`` included).

A thread of its own watches, so neither a busy event loop nor a busy main thread delays it.
Two signs, either one enough:

- EOF on a pipe whose write end only the parent holds (workers get one from their spawner):
  immediate;
- this process being reparented (``getppid()`` changes), checked every ``POLL_S``: for a
  parent whose forks still hold that pipe's write end, and for the preload template, which has
  no such pipe.

Why not ``PR_SET_PDEATHSIG``: the kernel sends it when the parent *thread* that started this
process ends (a client may spawn from a thread that then exits), so a handler would have to
check ``getppid()`` anyway; and a Python handler runs only on the main thread, which in a
worker sits in a blocking queue wait that signals do not interrupt, so the signal would have to
be blocked process-wide and waited for on a thread, a mask every child of the worker inherits.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

#: Seconds between checks that this process still has the parent it started with.
POLL_S = 0.5


def call_on_parent_death(on_death: Callable[[], None], pipe_fd: int | None = None) -> Callable[[], None]:
    """Call ``on_death`` once, from a watch thread, when this process's parent dies (or when
    ``pipe_fd``, a pipe the parent never writes to, reaches EOF).

    Returns a function that ends the watch and waits for its thread: a process that is about
    to ``fork`` calls it first, or the child could inherit a lock that thread held.
    """
    parent = os.getppid()
    stop_r, stop_w = os.pipe()
    poller = select.poll()
    poller.register(stop_r, select.POLLIN)
    if pipe_fd is not None:
        poller.register(pipe_fd, select.POLLIN)

    def watch() -> None:
        while os.getppid() == parent:
            ready = {fd for fd, _ in poller.poll(POLL_S * 1000)}
            if stop_r in ready:
                os.close(stop_r)
                return
            if pipe_fd in ready:
                break  # the parent never writes to its pipe: readable means EOF
        on_death()

    thread = threading.Thread(target=watch, name="monarch-parent-watch", daemon=True)
    thread.start()

    def stop() -> None:
        os.write(stop_w, b"!")
        os.close(stop_w)
        thread.join()

    return stop
