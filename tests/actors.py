"""Small actors several test modules use (importable as ``actors``, by workers too: they get
the client's import path)."""

from __future__ import annotations

from monarch.actor import Actor, endpoint


class Counter(Actor):
    """A number to bump and read: the simplest stateful actor."""

    def __init__(self, start: int = 0) -> None:
        self.v = start

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.v += by

    @endpoint
    def value(self) -> int:
        return self.v
