"""Lost TCP peers, seen by a proc that did not spawn them (so only its connections tell it):
a killed peer fails the calls pending on it at once, and a frozen one (it never answers the
handshake, or sits behind a cut link) once ``MONARCH_PEER_UNREACHABLE_S`` has passed; nothing
waits forever. A connection
that is reset under a live peer is re-established."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import netns
import pytest
from actors import Gate
from tcp_helpers import Where, tcp_procs

import monarch.actor
from monarch._src.actor.process_state import runtime
from monarch._src.runtime.config import configured
from monarch._src.transport.address import TcpAddress, parse
from monarch._src.transport.outgoing import PeerUnreachableError
from monarch.actor import ActorError, concurrent_endpoint, endpoint

UNREACHABLE_S = 1


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """Process ``pid`` stopped (SIGSTOP) for the duration of the block."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


class Target(Where):
    @concurrent_endpoint  # other calls still run beside it
    async def hang(self) -> None:
        await asyncio.Event().wait()


class Held(Gate, Where):
    """A gate that also tells where it is."""


class Relay(Where):
    """Calls another mesh from its own process (which did not spawn it)."""

    @endpoint
    async def hang_on(self, target: Any) -> None:
        await target.hang.call_one()

    @endpoint
    async def ping(self, target: Any, x: Any) -> Any:
        return await target.echo.call_one(x)


@pytest.fixture
def relay_and_target(monkeypatch: pytest.MonkeyPatch):
    """A relay and its target, each a proc on TCP; the target's failures, which these tests
    cause, are not the client's to report."""
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", lambda failure: None)
    env = {"MONARCH_PEER_UNREACHABLE_S": str(UNREACHABLE_S)}
    with tcp_procs(env=env) as relay_procs, tcp_procs() as target_procs:
        relay = relay_procs.spawn("relay", Relay)
        target = target_procs.spawn("target", Target)
        target_pid, target_address = target.where.call_one().get(timeout=30)
        assert target_address.startswith("tcp:")
        yield relay, target, target_pid, target_address


@pytest.mark.timeout(60)
def test_killed_tcp_peer_fails_the_calls_pending_on_it(relay_and_target):
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
def test_frozen_tcp_peer_fails_calls_after_the_unreachable_bound(relay_and_target):
    relay, target, target_pid, target_address = relay_and_target
    start = time.monotonic()
    with frozen(target_pid), pytest.raises(ActorError) as info:  # its kernel accepts; it never answers
        relay.ping.call_one(target, "anyone?").get(timeout=30)
    took = time.monotonic() - start
    assert f"could not be reached within {float(UNREACHABLE_S)}s" in str(info.value), str(info.value)
    assert UNREACHABLE_S <= took < UNREACHABLE_S + 3, took
    assert target.echo.call_one("thawed").get(timeout=10) == "thawed"  # the spawner's view is intact


def kill_connections_to(address: str) -> None:
    """Abort every TCP connection to ``address`` from outside, as a middlebox's reset would
    (``ss -K``; root)."""
    parsed = parse(address)
    assert isinstance(parsed, TcpAddress)
    done = subprocess.run(
        ["ss", "-K", "dst", parsed.host, "dport", "=", f":{parsed.port}"], capture_output=True, text=True
    )
    if done.returncode != 0 or parsed.host not in done.stdout:
        pytest.skip(f"cannot abort TCP connections with ss -K here: {done.stderr.strip()}")


@pytest.mark.timeout(60)
def test_tcp_connection_reset_under_a_live_peer_is_re_established() -> None:
    """The call sent before the reset runs once (the proc read it, or it is sent again as the
    proc's answer to the new connection's hello says it did not) and is not failed."""
    with tcp_procs() as pm:
        a = pm.spawn("a", Held)
        _, address = a.where.call_one().get(timeout=30)
        pending = a.wait.call_one()
        kill_connections_to(address)
        assert a.echo.call_one("after").get(timeout=10) == "after"
        assert a.release.call_one().get(timeout=10) == "released"
        assert pending.get(timeout=10) == "done"


@pytest.mark.timeout(60)
def test_tcp_peer_behind_a_cut_link_is_declared_unreachable_within_the_bound(cluster2: netns.Cluster) -> None:
    """Nothing answers the connection attempts at all (the kernel alone would retry for
    minutes): the runtime gives up at the bound and says so to whoever watches the peer."""
    host = cluster2.hosts[1]
    subprocess.run(["ip", "-n", host.netns, "link", "set", "eth0", "down"], check=True, timeout=10)
    address = f"tcp:{host.address}:4000"
    lost: list[BaseException] = []
    told = threading.Event()
    rt = runtime()
    rt.on_peer_lost(lambda peer, reason: (lost.append(reason), told.set()) if peer == address else None)
    with configured(peer_unreachable_s=UNREACHABLE_S):
        start = time.monotonic()
        rt.send(address, {"k": 9999}, [b""])
        assert told.wait(timeout=30), "the unreachable peer was never reported"
    took = time.monotonic() - start
    assert isinstance(lost[0], PeerUnreachableError), repr(lost[0])
    assert f"could not be reached within {float(UNREACHABLE_S)}s" in str(lost[0])
    assert UNREACHABLE_S <= took < UNREACHABLE_S + 2, took
