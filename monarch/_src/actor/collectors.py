"""Reply collectors behind the adverbs: each is a port handler resolving Futures.

``call`` gathers one reply per rank into a ValueMesh and fails on the first exception;
``call_one``/``choose`` take the first reply; ``stream`` resolves one future per reply, in
arrival order. A collector is told when a process it waits on dies, so no caller hangs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from monarch._src.actor import supervision
from monarch._src.actor.errors import SupervisionError
from monarch._src.actor.future import (
    Future,
    add_done_callback,
    outcome,
    pending_future,
    resolve,
    set_exception,
    set_result,
)
from monarch._src.actor.port import PortHandler
from monarch._src.mesh.shape import Shape
from monarch._src.mesh.value_mesh import ValueMesh


class OnceCollector(PortHandler):
    """First reply wins (``call_one``, ``choose``)."""

    def __init__(self, label: str = "port") -> None:
        self.future: Future[Any] = pending_future()
        self.label = label
        self.open()

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        self.close()  # closed, it expects nothing (see PortHandler.expect_from)
        if is_exception:
            resolve(self.future, None, value)
        else:
            resolve(self.future, value, None)

    def fail(self, exc: BaseException) -> None:
        self.close()
        set_exception(self.future, exc)


class GatherCollector(PortHandler):
    """One reply per rank of ``shape``, assembled into a ValueMesh (``call``)."""

    def __init__(self, shape: Shape, count: int, label: str = "port") -> None:
        self.future: Future[Any] = pending_future()
        self.label = label
        self._shape = shape
        self._values: list[Any] = [None] * count
        self._missing = count
        self._lock = threading.Lock()
        self.open()

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        if is_exception:
            self._finish()
            set_exception(self.future, value)
            return
        with self._lock:
            self._values[rank] = value  # type: ignore[index]
            self._missing -= 1
            complete = self._missing == 0
        if complete:
            self._finish()
            resolve(self.future, ValueMesh(self._shape, self._values), None)

    def fail(self, exc: BaseException) -> None:
        self.close()
        set_exception(self.future, exc)

    def _finish(self) -> None:
        self.close()
        self.stop_expecting()


class StopCollector(PortHandler):
    """One acknowledgement per rank of a stop; a process that is gone has stopped its actors too.

    A rank that could not stop in time answers with an exception saying what it is still
    running; the Future then fails with every such rank listed. Should a rank not answer at
    all (its process frozen or wedged), the Future fails ``grace_s`` after the bound, naming it.
    When a process dies, only its ranks count as stopped; when a connection with a live one
    closes, the stop or its acknowledgement may be lost with it, so the ranks that have not
    answered are sent the stop again (``resend``): stopping an actor twice is harmless, and an
    actor that is gone acknowledges at once.
    """

    def __init__(
        self, addresses: list[str], mesh_name: str, timeout: float, resend: Callable[[list[int]], None]
    ) -> None:
        self.future: Future[None] = pending_future()
        self._mesh_name = mesh_name
        self._timeout = timeout
        self._rank_addresses = addresses
        self._resend = resend
        self._pending = set(range(len(addresses)))
        self._problems: dict[int, str] = {}
        self._lock = threading.Lock()
        self.open()
        if not addresses:
            self.close()
            set_result(self.future, None)

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        with self._lock:
            if rank not in self._pending:
                return
            self._pending.discard(rank)
            if is_exception:
                self._problems[rank] = str(value)  # type: ignore[index]
            done = not self._pending
        if done:
            self._finish()

    def fail(self, exc: BaseException) -> None:
        """A process went away (its ranks are stopped), or a connection with one closed."""
        with self._lock:
            if not self._pending:
                return
            dead = supervision.dead_processes
            gone = {rank for rank in self._pending if self._rank_addresses[rank] in dead}
            self._pending -= gone
            waiting = sorted(self._pending)
        if not waiting:
            self._finish()
            return
        if not gone:  # a live process: the stop or its acknowledgement may be lost
            self._resend(waiting)
        self.expect_from({self._rank_addresses[rank] for rank in waiting})  # (no longer all)

    def overdue(self) -> None:
        """Past the bound and its grace: the ranks that never answered are reported too."""
        with self._lock:
            if not self._pending:
                return
            for rank in self._pending:
                self._problems[rank] = (
                    "its process did not answer the stop: it is frozen (SIGSTOP, a debugger) or "
                    "its event loop is blocked; ProcMesh.stop() kills such a process"
                )
            self._pending.clear()
        self._finish()

    def _finish(self) -> None:
        self.close()
        self.stop_expecting()
        if not self._problems:
            set_result(self.future, None)
            return
        ranks = sorted(self._problems)
        details = "\n".join(f"  rank {r}: {self._problems[r]}" for r in ranks)
        set_exception(
            self.future,
            SupervisionError(
                f"ActorMesh.stop() of {self._mesh_name}: ranks {ranks} did not stop within "
                f"{self._timeout:g} s:\n{details}\n"
                "The mesh is marked stopped here (calls to it fail); those actors stop once "
                "what they run returns.\nHINT: make the endpoint return (wait with a timeout, "
                "or use @concurrent_endpoint), or raise MONARCH_ACTOR_STOP_TIMEOUT_S."
            ),
        )


class StreamCollector(PortHandler):
    """``count`` futures resolved in the order replies arrive (``stream``)."""

    def __init__(self, count: int) -> None:
        self.futures: list[Future[Any]] = [pending_future() for _ in range(count)]
        self._next = 0
        self._lock = threading.Lock()
        self.open()

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        with self._lock:
            if self._next >= len(self.futures):
                return
            fut = self.futures[self._next]
            self._next += 1
            last = self._next == len(self.futures)
        if last:
            self.close()
            self.stop_expecting()
        if is_exception:
            set_exception(fut, value)
        else:
            set_result(fut, value)

    def fail(self, exc: BaseException) -> None:
        self.close()
        with self._lock:
            pending, self._next = self.futures[self._next :], len(self.futures)
        for f in pending:
            set_exception(f, exc)


def fold_stream(futures: list[Future[Any]], identity: Any, combine: Callable[[Any, Any], Any]) -> Future[Any]:
    """Left fold of a stream's futures, in arrival order, into one Future (``Accumulator``)."""
    result: Future[Any] = pending_future()
    state = {"i": 0, "acc": identity}

    def advance(_: Any = None) -> None:
        while state["i"] < len(futures):
            f = futures[state["i"]]
            if not f.done():
                add_done_callback(f, advance)
                return
            value, exc = outcome(f)
            if exc is not None:
                set_exception(result, exc)
                return
            try:
                state["acc"] = combine(state["acc"], value)
            except Exception as e:
                set_exception(result, e)
                return
            state["i"] += 1
        set_result(result, state["acc"])

    advance()
    return result
