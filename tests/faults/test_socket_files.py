"""A worker's socket file does not outlive the worker, however it ends or fails to start.

A worker removes its own socket file as it exits; one killed with ``-9``, one that crashed and
one that never started cannot, and their files used to pile up in the job's socket directory
until the job ended (a long job replacing failed workers, or retrying a spawn that fails,
left one per worker).
"""

from __future__ import annotations

import os
import signal
import textwrap

import pytest
from helpers import run_python, wait_until

from monarch._src.actor.process_state import runtime
from monarch.actor import Actor, endpoint, this_host


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _sockets() -> set[str]:
    """The socket files in this client's job directory."""
    return {n for n in os.listdir(runtime().socket_dir) if n.endswith(".sock")}


@pytest.mark.timeout(60)
def test_socket_files_of_killed_and_stopped_workers_are_removed(faults):
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        pids = pm.spawn("pid", Pid).pid.call().get(timeout=30).values()
        with_workers = _sockets()  # theirs, this process's and its reply addresses
        os.kill(pids[0], signal.SIGKILL)
        wait_until(lambda: faults, timeout=10, what="the killed worker to be reported")
        assert len(with_workers - _sockets()) == 1  # the killed worker's
    finally:
        pm.stop().get(timeout=10)
    assert len(with_workers - _sockets()) == 2  # and the stopped one's


SPAWN_OUT_OF_DESCRIPTORS = """
import os, resource
from monarch.actor import Actor, endpoint, this_host
from monarch._src.actor.process_state import runtime

class Pid(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

def sockets():
    return sorted(n for n in os.listdir(runtime().socket_dir) if n.endswith(".sock"))

pm = this_host().spawn_procs(per_host={"gpus": 1})
pm.spawn("pid", Pid).pid.call_one().get(timeout=30)
pm.stop().get(timeout=10)
before = sockets()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
open_now = len(os.listdir("/proc/self/fd"))
failed = 0
for room in range(2, 30):  # descriptors left for the spawn: it fails at each step of a start
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + room, hard))
    try:
        pm = this_host().spawn_procs(per_host={"gpus": 4})
    except OSError:
        failed += 1
        continue
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    pm.stop().get(timeout=30)
print("FAILED", failed)
print("LEFT", sorted(set(sockets()) - set(before)))
"""


@pytest.mark.timeout(120)
def test_a_spawn_that_fails_leaves_no_socket_file():
    proc = run_python(textwrap.dedent(SPAWN_OUT_OF_DESCRIPTORS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    failed = int(proc.stdout.split("FAILED ", 1)[1].split()[0])
    assert failed >= 3, proc.stdout  # the spawns did fail, at several points
    assert "LEFT []" in proc.stdout, proc.stdout
