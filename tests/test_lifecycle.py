"""Stopping actor meshes and proc meshes, cleanup hooks, and client shutdown."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psutil
import pytest
from actors import AsyncHolder, Held, Holder, Pid
from helpers import IMPORT_TEST_MODULES, wait_gone

from monarch.actor import (
    Actor,
    Channel,
    Port,
    SupervisionError,
    concurrent_endpoint,
    endpoint,
    this_host,
    this_proc,
)

REPO = Path(__file__).resolve().parents[1]


class Counter(Pid):
    def __init__(self) -> None:
        self.v = 0

    @endpoint
    def incr(self) -> int:
        self.v += 1
        return self.v


class WithCleanup(Actor):
    def __init__(self, port: Port[str]) -> None:
        self.port = port
        self.seen = 0

    @endpoint
    def work(self) -> int:
        self.seen += 1
        return self.seen

    def __cleanup__(self, exc) -> None:
        self.port.send(f"cleanup after {self.seen} exc={exc!r}")


class Blocky(Actor):
    @endpoint
    def block(self, started: Port[None]) -> None:
        started.send(None)
        threading.Event().wait()

    @endpoint
    def ping(self) -> str:
        return "pong"


class Cancellable(Actor):
    def __init__(self, port: Port[str]) -> None:
        self.port = port

    @concurrent_endpoint
    async def wait_forever(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.port.send("task_cancelled")
            raise

    @endpoint
    async def ping(self) -> str:
        return "pong"

    async def __cleanup__(self, exc) -> None:
        self.port.send("cleanup")


class Caller(Actor):
    @endpoint
    def call_incr(self, target) -> str:
        try:
            target.incr.call_one().get(timeout=10)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "no error"


def test_actor_mesh_stop_then_call_fails(procs2):
    a = procs2.spawn("a", Counter)
    b = procs2.spawn("b", Counter)
    caller = procs2.spawn("caller", Caller)
    assert a.incr.call().get(timeout=10).values() == [1, 1]
    one = a.slice(gpus=0)
    assert a.stop().get(timeout=10) is None
    for mesh in (a, one, a.slice(gpus=1)):
        with pytest.raises((SupervisionError, RuntimeError), match="stopped"):
            mesh.incr.call().get(timeout=10)
    # A reference held by another actor sees the stop as well.
    assert "stopped" in caller.slice(gpus=0).call_incr.call_one(one).get(timeout=10)
    # Other meshes on the same processes are unaffected.
    assert b.incr.call().get(timeout=10).values() == [1, 1]


def test_stop_runs_cleanup_after_pending_messages(procs1):
    port, receiver = Channel.open()
    m = procs1.spawn("cleanup", WithCleanup, port)
    for _ in range(3):
        m.work.broadcast()
    m.stop().get(timeout=10)
    assert receiver.recv().get(timeout=10) == "cleanup after 3 exc=None"


def test_stop_cancels_concurrent_tasks_before_cleanup(procs1):
    port, receiver = Channel.open()
    m = procs1.spawn("cancellable", Cancellable, port)
    pending = m.wait_forever.call_one()
    assert m.ping.call_one().get(timeout=10) == "pong"
    m.stop().get(timeout=10)
    assert [receiver.recv().get(timeout=10) for _ in range(2)] == ["task_cancelled", "cleanup"]
    # The caller of the cancelled endpoint is told, instead of waiting forever.
    with pytest.raises(SupervisionError, match="wait_forever"):
        pending.get(timeout=10)


@pytest.mark.parametrize("cls", [Holder, AsyncHolder], ids=["sync", "async"])
def test_stop_frees_what_the_actor_held_at_once(procs1, cls):
    """Once ``stop()`` returned, the actor's state is gone from its process (a GPU user stops
    one model's actor to make room for the next), however long the stop's own deadline is."""
    held = procs1.spawn("held", Held)
    holder = procs1.spawn("holder", cls)
    assert holder.hold.call_one().get(timeout=10)
    assert held.alive.call_one().get(timeout=10) == 1
    holder.stop().get(timeout=10)
    assert held.alive.call_one().get(timeout=10) == 0
    held.stop().get(timeout=10)


def test_a_stopped_actor_is_not_kept_by_the_connections_it_opened():
    """The holder's reply opens its process's connection to this client: that connection (and
    what it starts on the loop) outlives the holder, and must keep nothing of it."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        holder = procs.spawn("holder", Holder)
        assert holder.hold.call_one().get(timeout=10)  # (the process's first reply)
        held = procs.spawn("held", Held)
        assert held.instances.call_one("holder").get(timeout=10) == 1
        holder.stop().get(timeout=10)
        assert held.instances.call_one("holder").get(timeout=10) == 0
    finally:
        procs.stop().get(timeout=10)


def test_actor_mesh_stop_is_idempotent(procs1):
    m = procs1.spawn("c", Counter)
    assert m.incr.call_one().get(timeout=10) == 1
    m.stop().get(timeout=10)
    m.stop().get(timeout=10)
    other = procs1.spawn("other", Counter)
    assert other.incr.call_one().get(timeout=10) == 1


@pytest.mark.slow
def test_proc_mesh_stop_fails_calls_in_flight(procs1):
    b = procs1.spawn("blocky", Blocky)
    assert b.ping.call_one().get(timeout=10) == "pong"
    started, busy = Channel[None].open()
    in_flight = b.block.call_one(started)
    busy.recv().get(timeout=10)
    stopping = procs1.stop()
    # The actor never finishes its message: the process is ended anyway and the caller told.
    with pytest.raises(SupervisionError, match=r"blocky\.block\(\).*stopped"):
        in_flight.get(timeout=10)
    assert stopping.get(timeout=20) is None


def test_local_actor_stop():
    m = this_proc().spawn("local", Counter)
    assert m.incr.call_one().get(timeout=10) == 1
    m.stop().get(timeout=10)
    with pytest.raises((SupervisionError, RuntimeError), match="stopped"):
        m.incr.call_one().get(timeout=10)


def test_proc_mesh_stop_ends_processes_and_refuses_spawn():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        c = pm.spawn("c", Counter)
        pids = c.pid.call().get(timeout=10).values()
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        pm.stop().get(timeout=10)
    assert wait_gone(pids) == []
    with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
        pm.spawn("again", Counter).initialized.get(timeout=10)
    with pytest.raises(RuntimeError):
        c.incr.call().get(timeout=10)
    # Stopping again is harmless.
    pm.stop().get(timeout=10)


async def test_proc_mesh_async_context_manager():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    async with pm:
        pid = await pm.spawn("c", Counter).pid.call_one()
    assert wait_gone([pid]) == []


def test_proc_mesh_stop_without_any_reply_is_not_a_failure():
    code = textwrap.dedent(
        """
        import json
        import monarch.actor
        from monarch.actor import Actor, endpoint, this_host

        faults = []
        monarch.actor.unhandled_fault_hook = lambda f: faults.append(str(f))

        class Quiet(Actor):
            @endpoint
            def ping(self):
                return 1

        for _ in range(3):
            pm = this_host().spawn_procs(per_host={"gpus": 2})
            m = pm.spawn("quiet", Quiet)
            m.slice(gpus=1).ping.call_one().get(timeout=10)  # rank 0 never replies to the client
            pm.stop().get(timeout=10)
        print("RESULT " + json.dumps(faults), flush=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=45, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    assert json.loads(lines[0][len("RESULT ") :]) == []
    assert proc.returncode == 0


SHUTDOWN_SCRIPT = IMPORT_TEST_MODULES + textwrap.dedent(
    """
    import json
    from actors import AsyncHolder, Held, Holder, Pid
    from monarch.actor import shutdown_context, this_host

    pm = this_host().spawn_procs(per_host={"gpus": 2})
    pids = pm.spawn("p", Pid).pid.call().get(timeout=10).values()
    print("PIDS " + json.dumps(pids), flush=True)
    first = shutdown_context().get(timeout=10)
    second = shutdown_context().get(timeout=10)
    print("RESULT " + json.dumps([first, second]), flush=True)
    """
)


def test_client_cannot_restart_after_shutdown_context():
    code = textwrap.dedent(
        """
        from monarch.actor import shutdown_context, this_host
        this_host().spawn_procs(per_host={"gpus": 1}).stop().get(timeout=10)
        shutdown_context().get(timeout=10)
        try:
            pm = this_host().spawn_procs(per_host={"gpus": 1})
        except RuntimeError as e:
            print("RESULT refused", flush=True)
        else:
            pm.stop().get(timeout=10)
            print("RESULT restarted", flush=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=45, cwd=REPO)
    assert "RESULT refused" in proc.stdout, proc.stdout + proc.stderr


def test_shutdown_context_is_idempotent_and_ends_workers():
    proc = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_SCRIPT], capture_output=True, text=True, timeout=45, cwd=REPO
    )
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out["RESULT"]) == [None, None]
    pids = json.loads(out["PIDS"])
    assert len(pids) == 2
    assert wait_gone(pids) == []
