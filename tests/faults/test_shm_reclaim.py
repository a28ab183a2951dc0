"""Shared-memory files lent to a worker that is killed go back to the system at once."""

from __future__ import annotations

import glob
import os
import signal

import numpy as np
import pytest
from helpers import run_python, wait_until

import monarch.actor
from monarch._src.actor.process_state import runtime
from monarch.actor import Actor, endpoint, this_host

MIB = 1 << 20
KEPT = 4  # arrays of 4 MiB the worker keeps: their files stay lent to it


class Keeper(Actor):
    def __init__(self) -> None:
        self.kept: list = []

    @endpoint
    def keep(self, x) -> int:
        self.kept.append(x)
        return os.getpid()


def _job_bytes() -> int:
    """Bytes of this client's shared-memory files, as anyone can see them in /dev/shm."""
    total = 0
    for path in glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*"):
        try:
            total += os.stat(path).st_size
        except FileNotFoundError:
            pass
    return total


@pytest.mark.timeout(60)
def test_files_lent_to_a_killed_worker_are_removed_at_once(monkeypatch):
    faults: list = []  # the client would otherwise exit on the worker's death
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        keeper = pm.spawn("keeper", Keeper)
        pid = 0
        for i in range(KEPT):
            pid = keeper.keep.call_one(np.full(4 * MIB // 8, float(i))).get(timeout=30)
        lent = _job_bytes()  # with any free files earlier calls of this client left
        assert lent >= KEPT * 4 * MIB
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: _job_bytes() <= lent - KEPT * 4 * MIB, timeout=5, what="the lent files to go")
        wait_until(lambda: faults, timeout=5, what="the worker's death to be reported")
    finally:
        pm.stop().get(timeout=10)


ONE_SHOT_CLIENT = """
import glob, os, signal, time
import numpy as np
import monarch.actor
from monarch.actor import Actor, endpoint, this_host
from monarch._src.actor.process_state import runtime

faults = []
monarch.actor.unhandled_fault_hook = faults.append


class Taker(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def take(self, x):
        return x.nbytes


def files():
    return glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*")


def wait_for(what, done, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


pm = this_host().spawn_procs(per_host={"gpus": 1})
taker = pm.spawn("taker", Taker)
pid = taker.pid.call_one().get(timeout=30)
os.kill(pid, signal.SIGSTOP)  # it reads none of them
calls = [taker.take.call_one(np.full((4 << 20) // 8, float(i))) for i in range(4)]
wait_for("4 one-shot files", lambda: len(files()) == 4)
os.kill(pid, signal.SIGKILL)
for call in calls:
    try:
        call.get(timeout=30)
    except Exception as e:
        failure = type(e).__name__
print("CALLS", failure)
wait_for("the worker's death to be reported", lambda: faults)
started = time.monotonic()
wait_for("the files sent to the dead worker to go", lambda: not files(), timeout=5)
print("GONE", f"{time.monotonic() - started:.3f}")
pm.stop().get(timeout=10)
"""


@pytest.mark.timeout(60)
def test_one_shot_files_sent_to_a_killed_worker_are_removed_at_once():
    """Files beyond the pool (here: no pool) are one-shot: the receiver removes each as it maps
    it. A receiver killed before it read them never will; the sender removes them when the
    peer is lost (they held their size of memory until the job ended)."""
    proc = run_python(ONE_SHOT_CLIENT, MONARCH_SHM_POOL_BYTES="0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CALLS SupervisionError" in proc.stdout, proc.stdout
    assert "GONE" in proc.stdout, proc.stdout
