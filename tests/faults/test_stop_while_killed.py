"""Procs killed while an explicit ``ProcMesh.stop()`` is in progress are stopped, not failed.

A proc asked to stop may be killed before its actors report themselves stopped (its stop ran
past the bound and the stopper killed it, or someone killed it meanwhile). An actor in another
proc that owns a mesh there must not take that death for a failure (which, unhandled, reaches
the client's ``unhandled_fault_hook``); the death of a proc nobody stopped still is one.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from actors import Pid
from helpers import wait_until

import monarch.actor
from monarch.actor import Actor, Channel, Port, context, endpoint, hosts_from_config, this_host


class Busy(Pid):
    @endpoint
    def block_through_the_stop(self, told: Port[int]) -> None:
        """Tell ``told`` that it runs, and once this actor's process was asked to stop; then
        keep it waiting (until it is killed, or exits after its cleanup timeout)."""
        inst = context().actor_instance
        told.send(os.getpid())
        deadline = time.monotonic() + 20
        while not inst._stop_now and time.monotonic() < deadline:  # set by the stop, on the loop
            threading.Event().wait(0.01)
        told.send(os.getpid())
        threading.Event().wait(20)


class Parent(Actor):
    """Owns meshes on other procs (so their deaths are its to supervise)."""

    @endpoint
    def spawn_on(self, procs: Any, name: str) -> None:
        setattr(self, name, procs.spawn(name, Busy))
        getattr(self, name).pid.call().get(timeout=20)

    @endpoint
    def call_child(self, name: str) -> str:
        """ "ok", or why a call to the child mesh ``name`` failed."""
        try:
            getattr(self, name).pid.call().get(timeout=10)
        except Exception as e:
            return str(e)
        return "ok"


def stop_and_kill_while_stopping(pm: Any, busy: Any, count: int) -> None:
    """``pm.stop()``, and kill its procs once each is stopping."""
    port, receiver = Channel[int].open()
    busy.block_through_the_stop.broadcast(port)
    for _ in range(count):  # running: the stop cannot drop it unrun
        receiver.recv().get(timeout=20)
    stopped = pm.stop()
    pids = [receiver.recv().get(timeout=20) for _ in range(count)]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    stopped.get(timeout=20)


def spawn_parent_and_children(host: Any, pm: Any, spare: Any) -> tuple[Any, Any, Any, Any]:
    """A parent on procs of its own, owning a mesh on ``pm`` and one on ``spare``."""
    parent_procs = host.spawn_procs()
    parent = parent_procs.spawn("parent", Parent)
    parent.spawn_on.call_one(pm, "stopped_child").get(timeout=30)
    parent.spawn_on.call_one(spare, "spare_child").get(timeout=30)
    return parent_procs, parent, pm.spawn("busy", Busy), spare.spawn("spare", Pid)


@pytest.fixture(params=["this_host", pytest.param("agent_hosts", marks=pytest.mark.slow)])
def two_hosts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """Where the procs run: this machine (twice), or two hosts of agents (``local:2``)."""
    if request.param == "this_host":
        yield this_host(), this_host()
        return
    monkeypatch.setenv("MONARCH_TEST_HOSTS", "local:2")
    hosts = hosts_from_config("MONARCH_TEST_HOSTS")
    try:
        yield hosts.slice(hosts=0), hosts.slice(hosts=1)
    finally:
        hosts.shutdown().get(timeout=30)


@pytest.mark.timeout(60)
def test_procs_killed_during_their_stop_are_no_fault_but_others_are(
    monkeypatch: pytest.MonkeyPatch, two_hosts: tuple[Any, Any]
) -> None:
    faults: list[Any] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    first, second = two_hosts
    pm = first.spawn_procs(per_host={"gpus": 2})
    spare = second.spawn_procs()
    parent_procs, parent, busy, spare_pid = spawn_parent_and_children(second, pm, spare)
    try:
        stop_and_kill_while_stopping(pm, busy, 2)
        # Once the parent's process took in the deaths, calls there fail; a failure it reported
        # would have reached this process first (on the same connection).
        outcome = wait_until(
            lambda: (o := parent.call_child.call_one("stopped_child").get(timeout=20)) != "ok" and o,
            timeout=20,
            what="the parent to hear of the deaths",
        )
        assert "was stopped" in outcome, outcome
        assert faults == []

        os.kill(spare_pid.pid.call_one().get(timeout=10), signal.SIGKILL)  # nobody stopped it
        wait_until(
            lambda: any("spare_child" in f.report() for f in faults),
            timeout=10,
            what="the parent's report of the spare proc's death",
        )
    finally:
        parent_procs.stop().get(timeout=10)
        spare.stop().get(timeout=10)
