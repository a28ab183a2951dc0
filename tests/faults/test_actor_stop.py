"""Stop always ends: a stop resolves within its bound and says what did not stop, a stopping
process runs ``__cleanup__`` or says why it could not, queued broadcasts are reported, and an
actor that blocks on a call to itself gets an error instead of a deadlock.

Real faults: actors blocked in an endpoint (on an event nobody sets, or sleeping), mailboxes
holding more work than the cleanup bound, real worker processes and their stderr.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import wait_until

import monarch.actor
from monarch._src.runtime.config import CONFIG
from monarch.actor import (
    Actor,
    ActorError,
    MeshFailure,
    SupervisionError,
    concurrent_endpoint,
    endpoint,
    this_host,
)

pytestmark = pytest.mark.timeout(60)

DEADLINE_S = 15.0
STOP_BOUND_S = 1.0


@pytest.fixture
def procs(faults: list[MeshFailure], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Two procs; no stop in this file is a fault: anything reaching the client's hook (see
    ``faults``) fails the test."""
    monkeypatch.setattr(CONFIG, "actor_stop_timeout_s", STOP_BOUND_S, raising=False)
    monkeypatch.setenv("MONARCH_CLEANUP_TIMEOUT_S", "1")  # read by the workers
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=DEADLINE_S)
    assert faults == []


class Blocker(Actor):
    def __init__(self, marker_dir: str = "") -> None:
        self.never = threading.Event()
        self.marker_dir = marker_dir

    @endpoint
    def block(self) -> None:
        if self.marker_dir:  # lets the test see that the endpoint is running
            open(os.path.join(self.marker_dir, "blocking"), "w").close()
        self.never.wait()

    @endpoint
    def work(self, seconds: float) -> None:
        time.sleep(seconds)  # the work itself, not a synchronisation

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: Exception | None) -> None:
        if self.marker_dir:
            rank = monarch.actor.current_rank().rank
            with open(os.path.join(self.marker_dir, f"cleanup-{rank}"), "w") as f:
                f.write("ran")


def test_stop_of_a_blocked_actor_resolves_within_its_bound_naming_the_rank(procs: Any) -> None:
    mesh = procs.spawn("blocked", Blocker)
    mesh.ping.call().get(timeout=DEADLINE_S)
    mesh.slice(gpus=1).block.broadcast()
    mesh.slice(gpus=1).ping.broadcast()
    mesh.slice(gpus=1).ping.broadcast()
    start = time.monotonic()
    with pytest.raises(SupervisionError) as info:
        mesh.stop().get(timeout=DEADLINE_S)
    took = time.monotonic() - start
    message = str(info.value)
    assert "ranks [1] did not stop within 1 s" in message
    assert "is still running endpoint block()" in message
    assert "2 message(s) queued behind it" in message
    assert "HINT:" in message
    assert STOP_BOUND_S <= took < STOP_BOUND_S + 1.0
    with pytest.raises(SupervisionError, match="stopped"):
        mesh.ping.call().get(timeout=DEADLINE_S)


def test_proc_stop_runs_cleanup_and_reports_broadcasts_it_did_not_run(
    procs: Any, tmp_path: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    mesh = procs.spawn("busy", Blocker, str(tmp_path))
    mesh.ping.call().get(timeout=DEADLINE_S)
    for _ in range(8):  # 4 s of work per actor, more than the 1 s cleanup bound
        mesh.work.broadcast(0.5)
    procs.stop().get(timeout=DEADLINE_S)
    assert sorted(os.listdir(tmp_path)) == ["cleanup-0", "cleanup-1"]
    seen: list[str] = []

    def reported() -> bool:
        seen.append(capfd.readouterr().err)
        text = "".join(seen)
        return text.count("stopped before it ran") == 2 and "work() x" in text

    wait_until(reported, DEADLINE_S, "both actors' unrun broadcasts reported on the client's stderr")


def test_proc_stop_says_whose_cleanup_did_not_run(
    procs: Any, tmp_path: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    mesh = procs.spawn("stuck", Blocker, str(tmp_path))
    mesh.ping.call().get(timeout=DEADLINE_S)
    mesh.slice(gpus=0).block.broadcast()
    wait_until(lambda: os.path.exists(tmp_path / "blocking"), DEADLINE_S, "rank 0 to run block()")
    start = time.monotonic()
    procs.stop().get(timeout=DEADLINE_S)
    assert time.monotonic() - start < 1.0 + 3.0
    assert sorted(os.listdir(tmp_path)) == ["blocking", "cleanup-1"]
    seen: list[str] = []

    def reported() -> bool:
        seen.append(capfd.readouterr().err)
        return "is still running endpoint block()" in "".join(seen)

    wait_until(reported, DEADLINE_S, "the skipped __cleanup__ reported on the client's stderr")
    assert "its __cleanup__ did not run" in "".join(seen)


class SelfCaller(Actor):
    @endpoint
    def outer(self, me: Any) -> str:
        return me.inner.call_one().get(timeout=30)

    @endpoint
    def inner(self) -> str:
        return "inner"


def test_sync_actor_blocking_on_a_call_to_itself_gets_an_error(procs: Any) -> None:
    mesh = procs.slice(gpus=0).spawn("selfcall", SelfCaller)
    start = time.monotonic()
    with pytest.raises(ActorError, match="would deadlock") as info:
        mesh.outer.call_one(mesh).get(timeout=DEADLINE_S)
    assert time.monotonic() - start < 2.0
    assert "HINT:" in str(info.value)
    assert mesh.inner.call_one().get(timeout=DEADLINE_S) == "inner"  # the actor is fine


class AsyncSelfCaller(Actor):
    @endpoint
    async def outer(self, me: Any) -> str:
        return await me.inner.call_one()

    @concurrent_endpoint
    async def outer_beside_the_mailbox(self, me: Any) -> str:
        return await me.inner.call_one()

    @endpoint
    async def inner(self) -> str:
        return "inner"


def test_async_actor_awaiting_a_call_to_itself_gets_an_error(procs: Any) -> None:
    mesh = procs.slice(gpus=0).spawn("aselfcall", AsyncSelfCaller)
    start = time.monotonic()
    with pytest.raises(ActorError, match="await would deadlock") as info:
        mesh.outer.call_one(mesh).get(timeout=DEADLINE_S)
    assert time.monotonic() - start < 2.0
    assert "HINT:" in str(info.value) and "@concurrent_endpoint" in str(info.value)
    # From a concurrent endpoint the mailbox is free to run the call: no error, no deadlock.
    assert mesh.outer_beside_the_mailbox.call_one(mesh).get(timeout=DEADLINE_S) == "inner"


class Relay(Actor):
    @endpoint
    def broadcast_ping(self, target: Any) -> None:
        target.ping.broadcast()


def test_broadcast_reaching_a_stopped_actor_is_reported_to_its_owner(
    procs: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    target = procs.slice(gpus=0).spawn("target", Blocker)
    relay = procs.slice(gpus=1).spawn("relay", Relay)
    target.stop().get(timeout=DEADLINE_S)
    relay.broadcast_ping.call_one(target).get(timeout=DEADLINE_S)  # it does not know of the stop
    seen: list[str] = []

    def reported() -> bool:
        seen.append(capfd.readouterr().err)
        return "stopped before it ran 1 broadcast(s): ping() x1" in "".join(seen)

    wait_until(reported, DEADLINE_S, "the late broadcast reported on the client's stderr")
