"""Small actors several test modules use (importable as ``actors``, by workers too: they get
the client's import path)."""

from __future__ import annotations

import asyncio
import os
import socket

from monarch.actor import Actor, concurrent_endpoint, context, endpoint


class Pid(Actor):
    """Tells which process it runs in: how tests find the worker processes they kill or watch.
    Test actors that need this subclass it."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Where(Pid):
    """Tells which machine it runs on and where its proc listens: how many-host tests check
    that a proc landed on the host they expect."""

    @endpoint
    def where(self) -> list:
        return [socket.gethostname(), context().actor_instance.proc_id]


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


class Payload:
    """Stands for what an actor holds (a model, GPU memory): ``Held`` counts the live ones."""


class Holder(Actor):
    """Holds a ``Payload`` until it stops."""

    def __init__(self) -> None:
        self.payload = Payload()

    @endpoint
    def hold(self) -> bool:
        return True


class AsyncHolder(Holder):
    @endpoint
    async def hold(self) -> bool:  # type: ignore[override]
        return True


class Held(Actor):
    """Counts the ``Payload``s alive in its process (by name: a class sent by value is a copy)."""

    @endpoint
    def alive(self) -> int:
        import gc

        gc.collect()
        return sum(type(o).__name__ == "Payload" for o in gc.get_objects())

    @endpoint
    def instances(self, name: str) -> int:
        """How many instances of actors named ``name`` this process still has (stopped or not)."""
        import gc

        from monarch._src.actor.instance import ActorInstance

        gc.collect()
        return sum(isinstance(o, ActorInstance) and o.name == name for o in gc.get_objects())
