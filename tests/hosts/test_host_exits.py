"""Exits of procs on agent hosts reach the existing supervision: pending calls fail at once
with the exit status, the owner gets a MeshFailure, and a lost host fails every proc on it."""

from __future__ import annotations

import os
import signal
import threading

import psutil
import pytest
from actors import Pid
from helpers import wait_until

import monarch.actor
from monarch.actor import Actor, MeshFailure, SupervisionError, endpoint, this_proc

pytestmark = pytest.mark.timeout(60)


class Exiter(Pid):
    @endpoint
    def exit_now(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def block(self) -> None:
        threading.Event().wait(60)


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    """The failures that reach the client's root (the owner of top-level meshes)."""
    seen: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", seen.append)
    return seen


def test_a_proc_exit_fails_pending_calls_at_once_with_its_status(hosts2: object, faults: list) -> None:
    procs = hosts2.spawn_procs(per_host={"gpus": 1})
    actors = procs.spawn("exiter", Exiter)
    actors.pid.call().get(timeout=20)
    pending = actors.slice(hosts=1).block.call_one()
    procs.spawn("other", Exiter).slice(hosts=1).exit_now.broadcast(3)  # the same proc exits
    with pytest.raises(SupervisionError, match="exited with code 3"):
        pending.get(timeout=20)
    with pytest.raises(SupervisionError, match="exited with code 3"):  # later calls fail fast
        actors.slice(hosts=1).pid.call_one().get(timeout=5)
    assert actors.slice(hosts=0).pid.call_one().get(timeout=20) > 0  # the other host works
    procs.stop().get(timeout=20)
    # Each mesh on the dead proc failed once, at the client's root, with the exit status.
    assert sorted(f.mesh_name for f in faults) == ["exiter", "other"]
    assert all(f.crashed_ranks == [1] and "exited with code 3" in f.report() for f in faults), faults


class Owner(Actor):
    """Spawns procs on the hosts it is given and records the failures it supervises."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.procs: object = None

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure.report())
        return True

    @endpoint
    def spawn_and_kill(self, hosts: object) -> None:
        self.procs = hosts.spawn_procs(per_host={"gpus": 1})
        victims = self.procs.spawn("victim", Pid)
        os.kill(victims.slice(hosts=0).pid.call_one().get(timeout=20), signal.SIGKILL)

    @endpoint
    def seen(self) -> list[str]:
        return list(self.failures)

    @endpoint
    def stop_procs(self) -> None:
        self.procs.stop().get(timeout=20)


def test_the_owner_gets_a_mesh_failure_naming_the_signal(hosts2: object) -> None:
    owner = this_proc().spawn("owner", Owner)
    owner.spawn_and_kill.call_one(hosts2).get(timeout=30)
    failures = wait_until(lambda: owner.seen.call_one().get(timeout=20), what="the owner's MeshFailure")
    assert len(failures) == 1 and "Killed(sig=9)" in failures[0], failures
    owner.stop_procs.call_one().get(timeout=30)


def test_a_lost_host_fails_every_proc_on_it(hosts2: object, faults: list) -> None:
    procs = hosts2.spawn_procs(per_host={"gpus": 2})
    actors = procs.spawn("exiter", Exiter)
    pids = actors.pid.call().get(timeout=20)
    host0 = [pid for point, pid in pids.items() if point["hosts"] == 0]
    pending = actors.slice(hosts=0, gpus=1).block.call_one()
    session = psutil.Process(host0[0]).ppid()
    os.kill(session, signal.SIGKILL)  # the agent's session for this client: the host is lost
    with pytest.raises(SupervisionError, match="lost with its host|process .* failed"):
        pending.get(timeout=20)
    with pytest.raises(SupervisionError):
        actors.slice(hosts=0, gpus=0).pid.call_one().get(timeout=5)
    assert len(actors.slice(hosts=1).pid.call().get(timeout=20)) == 2
    procs.stop().get(timeout=20)
    assert sorted(f.crashed_ranks[0] for f in faults) == [0, 1], faults  # both procs of host 0
