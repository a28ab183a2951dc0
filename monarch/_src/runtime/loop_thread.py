"""The event loop every monarch process runs on its own daemon thread (``monarch-loop``)."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable
from typing import Any

#: Set to "asyncio" to run the runtime on the standard library's loop instead of uvloop.
LOOP_ENV = "MONARCH_EVENT_LOOP"


def new_event_loop() -> asyncio.AbstractEventLoop:
    if os.environ.get(LOOP_ENV, "uvloop") == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop
    except ImportError:  # uvloop is optional (not on every platform)
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def in_empty_context(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a context of its own with no context variable set: what it starts on a
    loop (a task, a reader, a timer: each copies the context it is made in) keeps nothing of
    its caller's. A connection opened to send an actor's message lives on after that actor
    stopped; holding the actor's context (``current_instance``) it would keep the actor, and
    all the actor holds, alive."""
    return contextvars.Context().run(fn, *args)


class LoopThread:
    """Owns a loop running forever on a daemon thread; ``stop`` ends it."""

    def __init__(self, name: str = "monarch-loop") -> None:
        self.loop = new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), name=name, daemon=True)
        self.thread.start()
        started.wait()
        self.ident = self.thread.ident

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self.ident

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the loop, in FIFO order with other calls from the same thread; from
        another thread (an actor's, whose context holds the actor) in an empty context, as
        ``in_empty_context`` says why."""
        if threading.get_ident() == self.ident:
            self.loop.call_soon(fn, *args)
        else:
            self.loop.call_soon_threadsafe(fn, *args, context=contextvars.Context())

    def run_sync(self, coro: Any, timeout: float | None = None) -> Any:
        """Run a coroutine on the loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 2.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.get_ident() != self.ident:
            self.thread.join(timeout)
