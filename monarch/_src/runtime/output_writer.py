"""Writing to this process's ``sys.stdout``/``sys.stderr`` without ever blocking the caller.

A terminal or pipe that nobody reads blocks its writer. The event loop must never be that
writer, so output forwarded from other processes goes through an ``OutputWriter``: a bounded
queue drained by a daemon thread of its own. When the queue is full, ``write`` refuses (the
caller counts what it dropped) instead of waiting or growing. The stream is looked up at each
write, so whatever ``sys.stdout`` is at the time (a notebook's, pytest's capture) gets the text.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

#: Characters a writer may hold before ``write`` starts refusing.
DEFAULT_MAX_PENDING = 8 << 20


class OutputWriter:
    """A bounded queue of text for ``sys.<name>``, written by its own daemon thread."""

    def __init__(self, name: str, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.name = name
        self.max_pending = max_pending
        self._cond = threading.Condition()
        self._items: collections.deque[str | Callable[[], None]] = collections.deque()
        self._pending = 0
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        return self._pending

    def write(self, text: str, force: bool = False) -> bool:
        """Queue ``text``; False (nothing queued) if the queue is full, unless ``force``."""
        if not text:
            return True
        with self._cond:
            if not force and self._pending + len(text) > self.max_pending and self._pending:
                return False
            self._items.append(text)
            self._pending += len(text)
            self._start_locked()
            self._cond.notify()
        return True

    def call_after(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (on the writer thread) once everything queued before it is written."""
        with self._cond:
            self._items.append(fn)
            self._start_locked()
            self._cond.notify()

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until what is queued now has been written."""
        if threading.current_thread() is self._thread:
            return False
        with self._cond:
            if not self._items and self._pending == 0:
                return True
        done = threading.Event()
        self.call_after(done.set)
        return done.wait(timeout)

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"monarch-{self.name}-writer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                batch, self._items = self._items, collections.deque()
            texts: list[str] = []
            for item in batch:
                if isinstance(item, str):
                    texts.append(item)
                    continue
                self._emit(texts)
                texts = []
                try:
                    item()
                except Exception:  # a callback's failure must not end the writer
                    pass
            self._emit(texts)

    def _emit(self, texts: list[str]) -> None:
        if not texts:
            return
        text = "".join(texts)
        stream = getattr(sys, self.name, None)
        try:
            if stream is not None:
                stream.write(text)
                stream.flush()
        except Exception:  # closed or broken stream: the text is lost, the writer lives on
            pass
        finally:
            with self._cond:
                self._pending -= len(text)


_writers: dict[str, OutputWriter] = {}
_writers_lock = threading.Lock()


def writer(name: str) -> OutputWriter:
    """This process's writer for ``"stdout"`` or ``"stderr"``."""
    w = _writers.get(name)
    if w is None:
        with _writers_lock:
            w = _writers.get(name)
            if w is None:
                w = _writers[name] = OutputWriter(name)
    return w


def stream_writer(stream: int) -> OutputWriter:
    """The writer for file descriptor number ``stream`` (1 stdout, 2 stderr)."""
    return writer("stderr" if stream == 2 else "stdout")


def flush_all(timeout: float) -> bool:
    """Wait (at most ``timeout`` seconds in all) until both writers wrote what they hold."""
    import time

    deadline = time.monotonic() + timeout
    ok = True
    for w in list(_writers.values()):
        ok = w.flush(max(0.0, deadline - time.monotonic())) and ok
    return ok


def after_written(fn: Callable[[], None], loop: asyncio.AbstractEventLoop, timeout: float) -> None:
    """(on ``loop``'s thread) Call ``fn`` there once both writers wrote what they hold now, or
    after ``timeout`` seconds if one is stuck: a pipe nobody reads must not hold up ``fn``.

    So that news about another process (its exit) follows the lines it printed before it."""
    writers = list(_writers.values())
    fired = [False]
    left = [len(writers)]

    def fire() -> None:
        if not fired[0]:
            fired[0] = True
            fn()

    def one_written() -> None:
        left[0] -= 1
        if left[0] == 0:
            fire()

    if not writers:
        fire()
        return

    def written() -> None:  # on a writer's thread
        loop.call_soon_threadsafe(one_written)

    loop.call_later(timeout, fire)
    for w in writers:
        w.call_after(written)
