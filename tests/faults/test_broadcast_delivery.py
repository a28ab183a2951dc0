"""A broadcast that cannot be delivered or run is a supervision event for the owner of the
actor, never silently dropped; a call in the same situation gets the error on its Future.

Real faults: arguments whose unpickling raises in the worker, a stale mesh reference naming a
method the actor's class lacks, and a worker whose thread stacks cannot be mapped (so a sync
actor's thread cannot start).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import wait_until

from monarch._src.actor.actor_mesh import ActorMesh
from monarch.actor import Actor, ActorError, MeshFailure, SupervisionError, endpoint, this_host

pytestmark = pytest.mark.timeout(60)

DEADLINE_S = 15.0
CLIENT_PID = os.getpid()


def wait_for_fault(faults: list[MeshFailure], mesh_name: str) -> MeshFailure:
    return wait_until(
        lambda: next((f for f in list(faults) if f.mesh_name == mesh_name), None),
        DEADLINE_S,
        f"a fault of mesh {mesh_name!r} at the client hook",
    )


@pytest.fixture
def proc(faults: list[MeshFailure]) -> Iterator[Any]:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm
    pm.stop().get(timeout=DEADLINE_S)


def _refuse_outside_client() -> None:
    if os.getpid() != CLIENT_PID:
        raise ValueError("this argument cannot be unpickled in a worker")


class UnpicklableThere:
    """Pickles in the client; unpickling raises in any other process."""

    def __reduce__(self) -> Any:
        return (_refuse_outside_client, ())


class Echo(Actor):
    @endpoint
    def take(self, value: Any) -> str:
        return "ran"

    @endpoint
    def ping(self) -> str:
        return "pong"


class EchoV2(Echo):
    """What a stale reference sees: a newer version of the class, with one more endpoint."""

    @endpoint
    def added_later(self) -> str:
        return "never here"


def test_broadcast_whose_arguments_do_not_unpickle_is_reported(proc: Any, faults: list[MeshFailure]) -> None:
    mesh = proc.spawn("undecodable", Echo)
    with pytest.raises(ActorError, match="cannot be unpickled in a worker"):
        mesh.take.call_one(UnpicklableThere()).get(timeout=DEADLINE_S)  # a call: on its Future
    sent = time.monotonic()
    mesh.take.broadcast(UnpicklableThere())
    failure = wait_for_fault(faults, "undecodable")
    assert time.monotonic() - sent < 2.0
    assert "a broadcast of endpoint take could not be run" in failure.report()
    assert "cannot be unpickled in a worker" in failure.report()


def test_broadcast_of_a_method_the_class_lacks_is_reported(proc: Any, faults: list[MeshFailure]) -> None:
    mesh = proc.spawn("stale", Echo)
    ref = mesh._ref
    stale: Any = ActorMesh(EchoV2, ref.name, ref.key, ref.addresses, ref.shape)
    with pytest.raises(ActorError, match="added_later"):
        stale.added_later.call_one().get(timeout=DEADLINE_S)
    stale.added_later.broadcast()
    failure = wait_for_fault(faults, "stale")
    assert "a broadcast of endpoint added_later could not be run" in failure.report()
    assert "has no attribute 'added_later'" in failure.report()


def _unmappable_thread_stacks() -> None:
    threading.stack_size(1 << 40)  # 1 TiB: every later pthread_create fails with ENOMEM/EAGAIN


class StackSize(Actor):
    """Async, so it runs on the loop and needs no thread of its own."""

    @endpoint
    async def restore(self) -> None:
        threading.stack_size(0)  # the worker's exit path needs a thread again


def test_sync_actor_whose_thread_cannot_start_is_reported(faults: list[MeshFailure]) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_unmappable_thread_stacks)
    try:
        pm.initialized.get(timeout=DEADLINE_S)
        mesh = pm.spawn("threadless", Echo)
        with pytest.raises(SupervisionError, match="its thread could not be started"):
            mesh.ping.call().get(timeout=DEADLINE_S)
        failure = wait_for_fault(faults, "threadless")
        assert "can't start new thread" in failure.report()
        assert "HINT:" in failure.report()
    finally:
        pm.spawn("restore", StackSize).restore.call().get(timeout=DEADLINE_S)
        pm.stop().get(timeout=DEADLINE_S)
