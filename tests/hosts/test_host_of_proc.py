"""``ProcMesh.host_mesh`` of a one-proc slice of a mesh on agent hosts is that proc's host (not
the client's machine), also on a copy of the mesh sent to an actor."""

from __future__ import annotations

import os

import psutil
import pytest
from actors import Pid

from monarch.actor import Actor, endpoint, this_proc

pytestmark = pytest.mark.timeout(60)


def session_of(pid: int) -> int:
    """The session that spawned proc ``pid`` (its parent)."""
    return psutil.Process(pid).ppid()


class Spawner(Actor):
    @endpoint
    def session_of_proc_on_host_of(self, procs: object) -> int:
        """Spawn a proc on the host of ``procs`` (one proc); return the pid of its session."""
        more = procs.host_mesh.spawn_procs(per_host={"gpus": 1})  # type: ignore[attr-defined]
        session = session_of(more.spawn("pid", Pid).pid.call_one().get(timeout=20))
        more.stop().get(timeout=20)
        return session


def test_host_mesh_of_a_one_proc_slice_is_that_procs_host(hosts2: object) -> None:
    procs = hosts2.spawn_procs(per_host={"gpus": 1})  # type: ignore[attr-defined]
    pids = procs.spawn("pid", Pid).pid.call().get(timeout=20)
    host1_pid = next(pid for point, pid in pids.items() if point["hosts"] == 1)
    one = procs.slice(hosts=1)
    assert repr(one.host_mesh) == repr(hosts2.slice(hosts=1))  # type: ignore[attr-defined]
    more = one.host_mesh.spawn_procs(per_host={"gpus": 1})
    pid = more.spawn("pid", Pid).pid.call_one().get(timeout=20)
    assert session_of(pid) == session_of(host1_pid) != os.getpid()
    # A copy sent to an actor knows the proc's host too.
    spawner = this_proc().spawn("spawner", Spawner)
    assert spawner.session_of_proc_on_host_of.call_one(one).get(timeout=60) == session_of(host1_pid)
    more.stop().get(timeout=20)
    procs.stop().get(timeout=20)
