"""A long-lived client (a service spawning and stopping meshes for days) keeps no per-mesh
state for meshes it stopped and dropped: its supervision tables and the runtime's peer
tables stay the size they were."""

from __future__ import annotations

import gc
import json
import textwrap

import pytest
from helpers import run_python

from monarch._src.actor import port, supervision  # internal: the tables under test
from monarch._src.actor.process_state import runtime
from monarch.actor import Actor, endpoint, this_host, this_proc

ROUNDS = 200
#: A process start costs ~0.1 s of CPU: fewer rounds of those.
PROC_ROUNDS = 10


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


def table_sizes() -> dict[str, int]:
    gc.collect()  # a process group and its watchers form cycles
    rt = runtime()
    return {
        "owned meshes": len(supervision._owned),
        "failed meshes": len(supervision._failed),
        "stopped meshes": len(supervision._stopped),
        "dead processes": len(supervision.dead_processes),
        "locally spawned processes": len(supervision.locally_spawned),
        "replies waited for": sum(1 for h in list(port._handlers.values()) if h._addresses),
        "open ports": len(port._handlers),
        "connections": len(rt._conns),
        "closed connections kept": rt.loop_thread.run_sync(closed_connections_kept(), timeout=10),
    }


async def closed_connections_kept() -> int:
    """(the runtime's loop, which changes its tables) Peers' connections that closed but are
    still listed among those an idle thread may read (the client's: none are ever read so)."""
    return sum(1 for conn in runtime().idle_reads._of if conn.closed)


def spawn_call_stop_proc_mesh(i: int) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    assert pm.spawn("echo", Echo).ping.call_one(i).get(timeout=30) == i
    pm.stop().get(timeout=30)


def spawn_call_stop_actor_mesh(i: int) -> None:
    mesh = this_proc().spawn("echo", Echo)
    assert mesh.ping.call_one(i).get(timeout=30) == i
    mesh.stop().get(timeout=30)


@pytest.mark.timeout(120)
def test_stopped_proc_meshes_leave_no_entries_but_kept_handles_still_fail_fast():
    spawn_call_stop_proc_mesh(-1)  # whatever the first mesh sets up once
    before = table_sizes()
    for i in range(PROC_ROUNDS):
        spawn_call_stop_proc_mesh(i)
    after = table_sizes()
    assert all(after[k] <= before[k] for k in before), (before, after)
    # What a handle still kept needs stays, however the rest was dropped.
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = pm.spawn("echo", Echo)
    assert mesh.ping.call_one(1).get(timeout=30) == 1
    pm.stop().get(timeout=30)
    del pm
    gc.collect()
    with pytest.raises(supervision.SupervisionError, match="was stopped"):
        mesh.ping.call_one(2).get(timeout=10)


@pytest.mark.timeout(60)
def test_stopped_actor_meshes_leave_no_entries():
    spawn_call_stop_actor_mesh(-1)
    before = table_sizes()
    for i in range(ROUNDS):
        spawn_call_stop_actor_mesh(i)
    after = table_sizes()
    assert all(after[k] <= before[k] for k in before), (before, after)


CHURN_SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, json, time
    from monarch.actor import Actor, endpoint, this_host
    from monarch._src.transport.connection import IncomingConnection

    class Echo(Actor):
        @endpoint
        def echo(self, x):
            return x

    class AsyncEcho(Actor):
        @endpoint
        async def echo(self, x):
            return x

    async def awaited(mesh):
        return await mesh.echo.call(1)

    for _ in range(3):
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        procs.spawn("e", Echo).echo.call(1).get()
        asyncio.run(awaited(procs.spawn("ae", AsyncEcho)))  # replies read by this loop too
        procs.stop().get()
    deadline = time.monotonic() + 20  # the workers' exits are seen shortly after their stop
    while True:
        gc.collect()
        left = [c.name for c in gc.get_objects() if isinstance(c, IncomingConnection)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    print("LEFT", json.dumps(left))
    """
)


def test_stopped_meshes_leave_no_connection_of_theirs_in_the_client():
    """Each connection a worker opened to the client (its read buffer alone is 128 KiB) goes
    once the mesh stopped: a client spawning and stopping meshes for days keeps none of them."""
    proc = run_python(CHURN_SCRIPT, timeout=90)
    assert proc.returncode == 0, proc.stderr
    left = [
        json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("LEFT ")
    ]
    assert left == [[]], proc.stdout
