"""A TCP reset of a connection to a reply address lent to an event loop (``loop_replies``).

A sync actor on a TCP proc opens an event loop of its own (the standard library's, or uvloop)
and awaits calls to a target on another proc: their replies come to that loop's reply address,
on a connection the loop watches itself (or, while the loop is not running, the runtime's loop
does). The caller's proc is frozen while the target sends several reads' worth of replies, and
the connection is reset (``ss -K``) with them unread: on resuming, the socket is readable and
reports an error at once (EPOLLERR; libuv, hence uvloop, would call a reader watching it once
for that, and never again). It is read to its end all the same: every reply read, the drop
settled at once, and the calls complete well before the runtime would have given up on the old
connection (``behind.IDLE_S``); each ran once, and a later call works.

The old connection may end on the loop's thread just before the runtime's loop reads the
target's new hello: that hello is still answered with what the old connection read, so that the
target sends again exactly the replies lost with it (not "unknown", which would leave them
neither sent again nor failed).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest
import uvloop
from helpers import freeze, wait_until
from tcp_helpers import Where, tcp_procs
from test_tcp_peer_loss import kill_connections_to
from test_tcp_unsent_resent import in_kernel

from monarch._src.actor.process_state import runtime
from monarch._src.runtime import behind
from monarch._src.transport.connection import SCRATCH_BYTES
from monarch.actor import Actor, concurrent_endpoint, endpoint

#: Replies held until released, and their size: together several times what one read of a
#: connection takes, yet what a sender keeps to send again (``resend_keep_bytes``).
HELD = 32
REPLY_BYTES = 64 << 10
#: Replies that make the caller's socket buffer grow (it grows only as it reads) before it is
#: frozen, so that it can then take in several reads' worth.
WARM_BYTES = 8 << 20
#: The calls must complete this soon after the caller resumes (well under ``behind.IDLE_S``, the
#: delay of an old connection whose end nobody reads).
BOUND_S = 2.5


class Target(Where):
    """``held`` answers once ``release`` was called, and counts its runs."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.runs = 0

    @concurrent_endpoint
    async def held(self, i: int) -> bytes:
        self.runs += 1
        await self.event.wait()
        return bytes([i]) * REPLY_BYTES

    @endpoint
    async def warm(self) -> bytes:
        return bytes(WARM_BYTES)

    @endpoint
    async def release(self) -> int:
        self.event.set()
        return self.runs


class LoopCaller(Actor):
    """Awaits calls to a target on an event loop of its own (opened in ``start``)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._target: Any = None
        self._held: Any = None

    @endpoint
    def start(self, target: Any, kind: str, keep_running: bool) -> tuple[int, str]:
        """Open a loop of ``kind`` and call ``target.held`` ``HELD`` times from it; the loop runs on, on a
        thread of its own, if ``keep_running`` (else it stops here: the runtime's loop reads
        its replies). This process's pid, and the loop's reply address."""
        self._target = target
        loop = self._loop = uvloop.new_event_loop() if kind == "uvloop" else asyncio.new_event_loop()
        address = loop.run_until_complete(self._begin())
        if keep_running:
            self._thread = threading.Thread(target=loop.run_forever, daemon=True)
            self._thread.start()
        return os.getpid(), address

    async def _begin(self) -> str:
        for _ in range(3):  # it connects to this loop's address, whose socket buffer grows
            assert len(await self._target.warm.call_one()) == WARM_BYTES
        self._held = [self._target.held.call_one(i) for i in range(HELD)]
        return runtime().loop_replies._lent[asyncio.get_running_loop()].address

    @endpoint
    def outcome(self) -> tuple[list[bool], float, str]:
        """Whether each held call returned its value, how long they took from now, and a later
        call's value."""
        loop = self._loop
        assert loop is not None
        start = time.monotonic()
        if self._thread is not None:
            replies = asyncio.run_coroutine_threadsafe(_within(_gather(self._held)), loop).result(30)
        else:  # the loop is not running: this thread waits, the runtime's loop reads its replies
            replies = [f.get(timeout=20) for f in self._held]
        took = time.monotonic() - start
        later = self._target.echo.call_one("later")
        if self._thread is not None:
            after = asyncio.run_coroutine_threadsafe(_within(later), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(10)
        else:
            after = loop.run_until_complete(_within(later))
        loop.close()
        return [r == bytes([i]) * REPLY_BYTES for i, r in enumerate(replies)], took, after


async def _gather(futures: list[Any]) -> list[Any]:
    return await asyncio.gather(*futures)


async def _within(awaitable: Any) -> Any:
    return await asyncio.wait_for(awaitable, 20)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "kind,keep_running",
    [("uvloop", True), ("asyncio", True), ("uvloop", False), ("asyncio", False)],
    ids=["uvloop-running", "asyncio-running", "uvloop-stopped", "asyncio-stopped"],
)
def test_a_reset_of_a_loops_reply_connection_with_replies_unread_is_read_to_its_end(
    kind: str, keep_running: bool
) -> None:
    assert BOUND_S < behind.IDLE_S
    with tcp_procs() as caller_procs, tcp_procs() as target_procs:
        caller = caller_procs.spawn("caller", LoopCaller)
        target = target_procs.spawn("target", Target)
        pid, address = caller.start.call_one(target, kind, keep_running).get(timeout=30)
        assert address.startswith("tcp:"), address

        freeze(pid)
        try:
            target.release.call_one().get(timeout=10)
            wait_until(
                lambda: in_kernel(address)[0] > 2 * SCRATCH_BYTES,
                10,
                "the replies to fill the caller's socket",
            )
            kill_connections_to(address)  # the target's connection to the loop's address
        finally:
            os.kill(pid, signal.SIGCONT)
        right, took, after = caller.outcome.call_one().get(timeout=60)
        assert right == [True] * HELD
        assert took < BOUND_S, f"the calls took {took:.1f}s to complete once the caller resumed"
        assert after == "later"
        assert target.release.call_one().get(timeout=10) == HELD  # each ran once
