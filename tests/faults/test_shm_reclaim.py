"""Shared-memory files lent to a worker that is killed go back to the system at once."""

from __future__ import annotations

import glob
import os
import signal

import numpy as np
import pytest
from helpers import wait_until

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
