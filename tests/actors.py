"""Small actors several test modules use (importable as ``actors``, by workers too: they get
the client's import path)."""

from __future__ import annotations

import asyncio
import os

from monarch.actor import Actor, concurrent_endpoint, endpoint


class Pid(Actor):
    """Tells which process it runs in: how tests find the worker processes they kill or watch.
    Test actors that need this subclass it."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Counter(Pid):
    """A number to bump and read: the simplest stateful actor."""

    def __init__(self, start: int = 0) -> None:
        self.v = start

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.v += by

    @endpoint
    def value(self) -> int:
        return self.v


class Gate(Actor):
    """``wait`` resolves only after ``release``; both run concurrently on one actor."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    @concurrent_endpoint
    async def wait(self) -> str:
        await self.event.wait()
        return "done"

    @endpoint
    async def release(self) -> str:
        self.event.set()
        return "released"
