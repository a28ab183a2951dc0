"""Noticing that a child process exited, on an event loop, without polling.

Both the spawner (a job's procs) and the host agent (its clients' sessions) need the same
thing: a callback on their loop once a ``subprocess.Popen`` child is gone. A pidfd the loop
watches does it with no thread; where pidfds are missing (old kernels), a thread waits.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Callable


def when_process_exits(
    loop: asyncio.AbstractEventLoop, proc: subprocess.Popen, callback: Callable[[], None]
) -> None:
    """Run ``callback`` on ``loop`` once ``proc`` has exited. Callable from any thread."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        threading.Thread(
            target=lambda: (proc.wait(), loop.call_soon_threadsafe(callback)), daemon=True
        ).start()
        return

    def readable() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        callback()

    loop.call_soon_threadsafe(loop.add_reader, pidfd, readable)
