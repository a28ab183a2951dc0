"""A TCP reset of the connection a live peer's replies travel on spares calls still running.

Two procs on TCP, A calling B: B's replies reach A on B's own connection. A middlebox's reset
of that connection (``ss -K``) while A's call is still running on B loses no reply: B
reconnects and says so in its hello, and the call completes over the new connection. (A reply
that was lost fails its call: tests/faults/test_reply_connection_dropped.py.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from actors import Gate
from tcp_helpers import Where, tcp_procs
from test_tcp_peer_loss import kill_connections_to

import monarch.actor
from monarch.actor import endpoint


class Target(Gate, Where):
    """A gate that also echoes."""


class Caller(Where):
    """Starts a call to another mesh and reports later how it ended."""

    def __init__(self) -> None:
        self._call: asyncio.Task[Any] | None = None

    @endpoint
    async def start_wait(self, gate: Any) -> None:
        self._call = asyncio.ensure_future(self._wait(gate.wait.call_one()))
        await gate.echo.call_one(None)  # the gate's process now has its connection to this one

    @staticmethod
    async def _wait(call: Any) -> Any:
        return await call

    @endpoint
    async def outcome(self) -> str:
        assert self._call is not None
        try:
            return await asyncio.wait_for(self._call, timeout=10)
        except Exception as e:
            return f"{type(e).__name__}: {e}"


@pytest.mark.timeout(60)
def test_tcp_reset_of_the_reply_connection_spares_a_call_still_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", lambda failure: None)
    with tcp_procs() as caller_procs, tcp_procs() as target_procs:
        caller = caller_procs.spawn("caller", Caller)
        gate = target_procs.spawn("gate", Target)
        _, caller_address = caller.where.call_one().get(timeout=30)
        caller.start_wait.call_one(gate).get(timeout=10)

        kill_connections_to(caller_address)  # the gate's replies travel on one of them
        assert gate.release.call_one().get(timeout=10) == "released"
        assert caller.outcome.call_one().get(timeout=20) == "done"
