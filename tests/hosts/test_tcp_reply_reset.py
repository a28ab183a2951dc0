"""A TCP reset of the connection a live peer's replies travel on fails the call waiting for them.

Two procs on TCP, A calling B: B's replies reach A on B's own connection. A middlebox's reset
of that connection (``ss -K``) while A's call is still running on B leaves A unable to know
whether the reply was lost, so the call fails with a clear error instead of waiting forever;
later calls from A to B work.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tcp_helpers import Where, tcp_procs
from test_tcp_peer_loss import Target, kill_connections_to

import monarch.actor
from monarch.actor import endpoint


class Caller(Where):
    """Starts a call to another mesh and reports later how it ended."""

    def __init__(self) -> None:
        self._call: asyncio.Task[Any] | None = None

    @endpoint
    async def start_hang(self, target: Any) -> None:
        self._call = asyncio.ensure_future(self._wait(target.hang.call_one()))
        await target.echo.call_one(None)  # sent after the hang: it runs once this answers

    @staticmethod
    async def _wait(call: Any) -> Any:
        return await call

    @endpoint
    async def outcome(self) -> str:
        assert self._call is not None
        try:
            await asyncio.wait_for(self._call, timeout=10)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "returned"

    @endpoint
    async def echo_via(self, target: Any, x: Any) -> Any:
        return await target.echo.call_one(x)


@pytest.mark.timeout(60)
def test_tcp_reset_of_the_reply_connection_fails_the_pending_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", lambda failure: None)
    with tcp_procs() as caller_procs, tcp_procs() as target_procs:
        caller = caller_procs.spawn("caller", Caller)
        target = target_procs.spawn("target", Target)
        _, caller_address = caller.where.call_one().get(timeout=30)
        _, target_address = target.where.call_one().get(timeout=30)
        caller.start_hang.call_one(target).get(timeout=10)

        kill_connections_to(caller_address)  # the target's replies travel on one of them
        outcome = caller.outcome.call_one().get(timeout=20)
        assert outcome.startswith("ConnectionError"), outcome
        for part in (f"connection from {target_address} closed", "reply", "still alive", "HINT:"):
            assert part in outcome, outcome
        assert caller.echo_via.call_one(target, "after").get(timeout=10) == "after"
