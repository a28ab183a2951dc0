"""Heartbeats between the processes that use hosts and those hosts' sessions.

A host reached through an agent can be lost without any connection closing: its machine frozen
(every process stopped, while its kernel still acknowledges TCP), or its network cut (nothing
comes back at all, and TCP retries for minutes). Connection errors alone would leave calls on
it waiting, so each process that attached to hosts or spawned procs on them pings each such
host's session (``Pulse``): one small message per host, not per proc, five times per
``host_heartbeat_timeout_s``. A host whose session answered none of them for that long is
declared lost by the pinging process (``remote.host_lost``: its procs fail at once, naming the
host and the bound).

The session keeps the other end (``HeartbeatActor``): a requester it stops hearing from for its
bound is taken for lost as if its process had died (the procs it spawned there are killed), and
when that requester is the client itself the session exits, so nothing of a client that declared the
host lost survives there: not after a cut link comes back, nor after a frozen machine resumes
(the client has also closed its agent connection, which the agent reads on resuming and ends
the session; the procs follow their session's death).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.port import Port, PortHandler
from monarch._src.actor.proc_mesh import root_address
from monarch._src.actor.process_state import runtime
from monarch._src.runtime.config import CONFIG

logger = logging.getLogger("monarch.host")

#: Pings sent per bound: a host is declared lost after missing this many in a row.
PINGS_PER_TIMEOUT = 5
#: The actor key of every session's ``HeartbeatActor``.
HEARTBEAT_KEY = "__monarch_heartbeat__"
#: Names the setting in the loss report, so that whoever reads it knows what to change.
SETTING = "host_heartbeat_timeout_s, MONARCH_HOST_HEARTBEAT_TIMEOUT_S"


class Pulse(PortHandler):
    """This process's heartbeat to one host's session: ``ping(port, timeout_s)`` sends one ping
    whose answer goes to ``port``; ``on_lost(why)`` is called once if no answer came for
    ``host_heartbeat_timeout_s``. Runs on the runtime's loop until stopped or lost."""

    label = "host heartbeat"

    def __init__(
        self, agent: str, ping: Callable[[Port[None], float], None], on_lost: Callable[[str], None]
    ) -> None:
        self.agent = agent
        self._ping = ping
        self._on_lost = on_lost
        self.timeout_s = CONFIG.host_heartbeat_timeout_s
        self._last_answer = time.monotonic()
        self.stopped = False
        self.open()

    def start(self) -> None:
        runtime().loop_thread.call_soon(self._tick)

    def stop(self) -> None:
        """No more pings; nothing is reported (the host was let go, or is already lost)."""
        self.stopped = True
        self.stop_expecting()
        self.close()

    def deliver(self, rank: int | None, value: object, is_exception: bool) -> None:
        if not is_exception:  # an undeliverable ping is no sign of life
            self._last_answer = time.monotonic()

    def _tick(self) -> None:  # on the loop
        if self.stopped:
            return
        silent = time.monotonic() - self._last_answer
        if silent >= self.timeout_s:
            self.stop()
            self._on_lost(
                f"host agent {self.agent} answered no heartbeat for {silent:.1f}s "
                f"(the bound is {self.timeout_s:g}s: {SETTING})"
            )
            return
        rt = runtime()
        try:
            self._ping(Port(rt.address, self.port_id), self.timeout_s)
        except Exception:  # the next tick tries again; silence is what counts
            logger.debug("heartbeat to %s not sent", self.agent, exc_info=True)
        interval = self.timeout_s / PINGS_PER_TIMEOUT
        rt.loop.call_later(min(interval, self.timeout_s - silent), self._tick)


class HeartbeatActor(Actor):
    """In a host's session: answers pings, and takes a requester it stops hearing from within
    the bound it pings with for lost: the client, by exiting the session (the procs follow
    their parent's death); any other process, by asking ``host`` (the session's ``HostActor``)
    to kill the procs it spawned here. Async, so that it answers on the loop even while the
    ``HostActor`` waits for a spawn (a template importing torch)."""

    def __init__(self, host: Any) -> None:
        self._host = host
        #: requester -> (monotonic time of its last ping, its bound)
        self._last: dict[str, tuple[float, float]] = {}

    @endpoint
    async def beat(self, requester: str, timeout_s: float) -> None:
        if requester not in self._last:
            runtime().loop.call_later(timeout_s, self._check, requester)
        self._last[requester] = (time.monotonic(), timeout_s)

    def _check(self, requester: str) -> None:  # on the loop
        last, timeout_s = self._last[requester]
        silent = time.monotonic() - last
        if silent < timeout_s:
            runtime().loop.call_later(timeout_s - silent, self._check, requester)
            return
        del self._last[requester]
        why = f"no heartbeat from {requester} for {silent:.1f}s (its bound: {timeout_s:g}s)"
        if requester == root_address():
            logger.warning("exiting: the client stopped sending heartbeats (%s)", why)
            os._exit(1)  # the procs it spawned here follow (parent-death watch)
        self._host.requester_silent.broadcast(requester, why)
