"""Lost TCP peers, seen by a proc that did not spawn them (so only its connections tell it):
a killed peer fails the calls pending on it at once, and a frozen one (it never answers the
handshake) once ``MONARCH_PEER_UNREACHABLE_S`` has passed; nothing waits forever. A connection
that a live peer drops is re-established."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
from tcp_helpers import Where, tcp_procs

import monarch.actor
from monarch.actor import ActorError, MeshFailure, concurrent_endpoint, endpoint

UNREACHABLE_S = 1


class Target(Where):
    @endpoint
    async def hang(self) -> None:
        await asyncio.Event().wait()


class Dropper(Where):
    @concurrent_endpoint
    async def never(self) -> None:
        await asyncio.Event().wait()

    @endpoint
    async def drop_incoming(self) -> int:
        from monarch._src.actor.proc import runtime

        conns = list(runtime()._incoming)
        for conn in conns:
            conn.abort(ConnectionResetError("dropped by the test"))
        return len(conns)


class Relay(Where):
    """Calls another mesh from its own process (which did not spawn it)."""

    @endpoint
    async def hang_on(self, target: Any) -> None:
        await target.hang.call_one()

    @endpoint
    async def ping(self, target: Any, x: Any) -> Any:
        return await target.echo.call_one(x)


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    seen: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", seen.append)
    return seen


@pytest.fixture
def relay_and_target(faults: list[MeshFailure]):
    env = {"MONARCH_PEER_UNREACHABLE_S": str(UNREACHABLE_S)}
    with tcp_procs(env=env) as relay_procs, tcp_procs() as target_procs:
        relay = relay_procs.spawn("relay", Relay)
        target = target_procs.spawn("target", Target)
        target_pid, target_address = target.where.call_one().get(timeout=30)
        assert target_address.startswith("tcp:")
        yield relay, target, target_pid, target_address


@pytest.mark.timeout(60)
def test_killed_tcp_peer_fails_the_calls_pending_on_it(relay_and_target, faults):
    relay, target, target_pid, target_address = relay_and_target
    assert relay.ping.call_one(target, "connected").get(timeout=10) == "connected"
    pending = relay.hang_on.call_one(target)
    os.kill(target_pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(ActorError) as info:
        pending.get(timeout=30)
    took = time.monotonic() - start
    assert target_address in str(info.value) and "nobody listens" in str(info.value), str(info.value)
    assert took < 3, f"the relay took {took:.1f}s to learn its peer was gone"
    assert relay.echo.call_one("relay fine").get(timeout=10) == "relay fine"


@pytest.mark.timeout(60)
def test_frozen_tcp_peer_fails_calls_after_the_unreachable_bound(relay_and_target, faults):
    relay, target, target_pid, target_address = relay_and_target
    os.kill(target_pid, signal.SIGSTOP)  # its kernel still accepts connections; it never answers
    try:
        start = time.monotonic()
        with pytest.raises(ActorError) as info:
            relay.ping.call_one(target, "anyone?").get(timeout=30)
        took = time.monotonic() - start
    finally:
        os.kill(target_pid, signal.SIGCONT)
    assert f"could not be reached within {float(UNREACHABLE_S)}s" in str(info.value), str(info.value)
    assert UNREACHABLE_S <= took < UNREACHABLE_S + 3, took
    assert target.echo.call_one("thawed").get(timeout=10) == "thawed"  # the spawner's view is intact


@pytest.mark.timeout(60)
def test_tcp_connection_dropped_by_a_live_peer_is_re_established() -> None:
    with tcp_procs() as pm:
        a = pm.spawn("a", Dropper)
        assert a.echo.call_one("before").get(timeout=30) == "before"
        pending = a.never.call_one()
        assert a.drop_incoming.call_one().get(timeout=10) >= 1
        with pytest.raises(ConnectionError) as info:
            pending.get(timeout=10)
        assert "still alive" in str(info.value), str(info.value)
        assert a.echo.call_one("after").get(timeout=10) == "after"
