"""``Future``: a result that can be waited for from a thread (``get``) or awaited on any loop.

Results are produced on the runtime's loop thread or on an actor's thread, so the future is
thread-safe and resolves without touching any event loop; awaiting on a foreign loop (user
code, Jupyter, a web service) bridges with ``call_soon_threadsafe``. The outcome is cached: a
future can be awaited or ``get()``-ed any number of times, and a ``get`` timeout does not
cancel the work.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from monarch._src.transport.cork import flush_corked

if TYPE_CHECKING:
    import asyncio

R = TypeVar("R")

_PENDING = 0
_DONE = 1


#: The runtime loop's thread, which must never block (None until a runtime started).
_loop_thread_ident: int | None = None


def set_loop_thread(ident: int | None) -> None:
    """Let the runtime tell futures which thread must never block (its loop thread)."""
    global _loop_thread_ident
    _loop_thread_ident = ident


def _nothing_to_do_before_blocking() -> Callable[[], None] | None:
    return None


_before_blocking_wait: Callable[[], Callable[[], None] | None] = _nothing_to_do_before_blocking


def set_blocking_wait_hook(hook: Callable[[], Callable[[], None] | None]) -> None:
    """Let the runtime act before a thread blocks in ``get`` (and after, through the function
    ``hook`` returns): replies the thread's own event loop reads must be read by another meanwhile."""
    global _before_blocking_wait
    _before_blocking_wait = hook


class ThreadWait(Protocol):
    """How a thread that reads its own replies waits (``runtime/thread_replies.py``)."""

    #: Registered with the future waited for: its ``release()`` wakes the waiting thread.
    waker: Any

    def wait(self, future: Future[Any], timeout: float | None) -> bool | None:
        """Until ``future`` is done (True) or ``timeout`` (False); None: wait otherwise."""


def _no_thread_wait() -> ThreadWait | None:
    return None


_thread_wait: Callable[[], ThreadWait | None] = _no_thread_wait


def set_thread_wait_hook(hook: Callable[[], ThreadWait | None]) -> None:
    """Let the runtime say how the calling thread waits in ``get``: reading the replies to the
    calls it made itself (``hook()`` returns how), or, where it returns None, on a lock."""
    global _thread_wait
    _thread_wait = hook


_warned_in_loop = False


class _ThreadKind(threading.local):
    #: Set on a sync actor's thread (a class default: a missing attribute would raise and
    #: catch an AttributeError on every ``get``).
    sync_actor = False


_this_thread = _ThreadKind()


def mark_sync_actor_thread() -> None:
    """Sync endpoints run on their own thread: blocking there is legal and silent."""
    _this_thread.sync_actor = True


#: Futures that must never be waited for where they are made (an actor's call to itself) ->
#: (the sync actor's thread ident or the async actor's mailbox task, why). Weak: it costs
#: nothing once the future is gone.
_self_calls: weakref.WeakKeyDictionary[Future[Any], tuple[object, str]] = weakref.WeakKeyDictionary()
#: Whether ``_self_calls`` ever had an entry: until then a wait looks nothing up (most
#: processes never call their own actors, and the mapping's ``len`` is a Python call).
_any_self_calls = False


def forbid_waiting(future: Future[Any], waiter: object, why: str) -> None:
    """``future.get()`` on that thread (an int ident), or ``await future`` in that task, raises
    ``RuntimeError(why)`` instead of deadlocking."""
    global _any_self_calls
    _self_calls[future] = (waiter, why)
    _any_self_calls = True


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or timeout < 0 or math.isnan(timeout) or math.isinf(timeout)
    ):
        raise ValueError(f"invalid timeout {timeout!r}: expected None or a finite number >= 0")


class Future(Generic[R]):
    """The result of a monarch operation. ``get()`` it from a thread, or ``await`` it."""

    __slots__ = (
        "_state",
        "_value",
        "_exc",
        "_lock",
        "_waiters",
        "_callbacks",
        "_awaiting",
        "_replies_here",
        "__weakref__",
    )

    # Declared here because ``pending_future`` sets them, skipping ``__init__`` for speed.
    _state: int  # _PENDING or _DONE
    _value: R | None  # the result once done without an exception
    _exc: BaseException | None
    _lock: threading.Lock
    _waiters: list[Any] | None  # what each blocked get() waits on to be released; None until needed
    _callbacks: list[Callable[[Future[R]], None]] | None
    #: The asyncio future of the first ``await`` of this one and its loop's thread, resolved
    #: by ``_finish`` itself: the common ``await`` costs no done-callback (see ``_mirror_on``).
    _awaiting: tuple[asyncio.Future[Any], int] | None
    #: Its outcome comes in replies sent to the thread that made the call, which reads them
    #: while it waits (``read_by_waiting_thread``); False: it is waited for on a lock.
    _replies_here: bool

    def __init__(self) -> None:
        raise TypeError(
            "Future objects are returned by Monarch operations and cannot be constructed directly."
        )

    # -- completion (any thread; reached through the module functions below) ------------------

    def _finish(self, value: Any, exc: BaseException | None) -> bool:
        with self._lock:
            if self._state == _DONE:
                return False
            self._value, self._exc, self._state = value, exc, _DONE
            waiters, self._waiters = self._waiters, None
            callbacks, self._callbacks = self._callbacks, None
            awaiting, self._awaiting = self._awaiting, None
        if waiters:
            for w in waiters:
                w.release()
        if awaiting is not None:
            afut, loop_ident = awaiting
            if threading.get_ident() != loop_ident:
                try:
                    afut.get_loop().call_soon_threadsafe(_copy_outcome, self, afut)
                except RuntimeError:  # the awaiting loop has closed
                    pass
            elif not afut.done():  # (done: the awaiting task was cancelled)
                if exc is None:
                    afut.set_result(value)
                else:
                    afut.set_exception(exc)
        if callbacks:
            for cb in callbacks:
                cb(self)
        return True

    def done(self) -> bool:
        """Whether the outcome is in, so that ``get()`` returns or raises without blocking."""
        return self._state == _DONE

    def _outcome(self) -> R:
        if self._exc is not None:
            raise self._exc
        return self._value  # type: ignore[return-value]

    # -- blocking -------------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> R:
        """Block until the result is ready; ``TimeoutError`` after ``timeout`` seconds.

        The timeout does not cancel the operation: a later ``get``/``await`` sees its outcome.
        """
        if timeout is not None:
            _check_timeout(timeout)
        if self._state == _DONE:  # (``_outcome``, inline: most futures are done when got)
            if self._exc is not None:
                raise self._exc
            return self._value  # type: ignore[return-value]
        ident = threading.get_ident()
        if ident == _loop_thread_ident:
            raise RuntimeError(
                "Future.get() was called on the monarch runtime's event loop thread, where "
                "blocking would deadlock (e.g. inside an async endpoint).\n"
                "HINT: use `await fut` instead of `fut.get()` in async code."
            )
        if _any_self_calls:
            guard = _self_calls.get(self)
            if guard is not None and guard[0] == ident and self._state != _DONE:
                raise RuntimeError(guard[1])
        self._warn_if_in_loop()
        reader = _thread_wait() if self._replies_here else None
        started = time.monotonic() if reader is not None and timeout is not None else 0.0
        waiter = self._add_waiter(reader.waker if reader is not None else None)
        if waiter is not None:
            flush_corked()  # what this thread sent in a burst may be what it is waiting for
            # Replies to calls made on this thread's running loop are that loop's to read, and it
            # is blocked here: the runtime's loop reads them meanwhile.
            unblock = _before_blocking_wait()
            try:
                ok = reader.wait(self, timeout) if reader is not None else None
                if ok is None:  # on a lock, as any thread
                    left = timeout
                    if reader is not None:  # no reading here after all (its address closed)
                        if timeout is not None:
                            left = max(0.0, timeout - (time.monotonic() - started))
                        self._remove_waiter(waiter)
                        waiter = self._add_waiter(None)
                    ok = waiter is None or waiter.acquire(True, -1 if left is None else left)
            finally:
                if unblock is not None:
                    unblock()
            if not ok:
                self._remove_waiter(waiter)
                if self._state != _DONE:
                    raise TimeoutError(f"monarch Future not ready after {timeout} s")
        return self._outcome()

    def _add_waiter(self, waker: Any) -> Any:
        """Register ``waker`` (None: a new held lock) to be released once this future is done;
        returns it, or None if it is done already."""
        with self._lock:
            if self._state == _DONE:
                return None
            if waker is None:
                waker = threading.Lock()
                waker.acquire()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waker)
            return waker

    def _remove_waiter(self, waiter: Any) -> None:
        with self._lock:
            if self._waiters and waiter in self._waiters:
                self._waiters.remove(waiter)

    def _warn_if_in_loop(self) -> None:
        global _warned_in_loop
        if _warned_in_loop or _this_thread.sync_actor:
            return
        asyncio = sys.modules.get("asyncio")  # no asyncio imported: no loop can be running
        if asyncio is None or asyncio._get_running_loop() is None:
            return
        _warned_in_loop = True
        warnings.warn(
            "Future.get() was called from within an active event loop. This blocks the loop; "
            "use `await` instead.",
            UserWarning,
            stacklevel=3,
        )

    def result(self, timeout: float | None = None) -> R:
        """Same as ``get``: the name ``concurrent.futures`` users reach for."""
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like ``get`` and return the exception the operation failed with, or None if it succeeded."""
        try:
            self.get(timeout)
        except TimeoutError:
            if self._state != _DONE:
                raise
        except BaseException:
            pass
        return self._exc

    # -- awaiting -------------------------------------------------------------------------------

    def as_asyncio(self) -> asyncio.Future[R]:
        """A fresh asyncio future on the running loop that mirrors this one (non-consuming)."""
        import asyncio

        return self._mirror_on(asyncio.get_running_loop())

    def _mirror_on(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[R]:
        """``as_asyncio`` on ``loop``, the running loop of this thread. The first mirror is
        resolved by ``_finish`` directly (``_awaiting``), any further one by a done-callback."""
        import asyncio

        afut: asyncio.Future[R] = asyncio.Future(loop=loop)  # (``create_future``, less a call)
        loop_ident = threading.get_ident()
        with self._lock:
            if self._state != _DONE and self._awaiting is None:
                self._awaiting = (afut, loop_ident)
                return afut
        if self._state == _DONE:
            _copy_outcome(self, afut)
            return afut

        def on_done(f: Future[R]) -> None:
            if threading.get_ident() == loop_ident:
                _copy_outcome(f, afut)
            else:
                try:
                    loop.call_soon_threadsafe(_copy_outcome, f, afut)
                except RuntimeError:  # the awaiting loop has closed
                    pass

        add_done_callback(self, on_done)
        return afut

    def __await__(self) -> Generator[Any, None, R]:
        # Not a generator itself: the awaiting task iterates the asyncio future's own (C)
        # iterator, with no Python frame of this method to resume once the reply is in.
        if self._state == _DONE:
            return _outcome_when_awaited(self)
        import asyncio

        loop = asyncio._get_running_loop()
        if loop is None:
            raise ValueError("__await__ with no active event loop (either asyncio or tokio)")
        if _any_self_calls:
            guard = _self_calls.get(self)
            if guard is not None and guard[0] is asyncio.current_task() and self._state != _DONE:
                raise RuntimeError(guard[1])
        flush_corked()  # as in get(): a burst this thread sent may be what it now waits for
        return self._mirror_on(loop).__await__()

    def __repr__(self) -> str:
        if self._state != _DONE:
            return "<monarch.actor.Future pending>"
        if self._exc is not None:
            return f"<monarch.actor.Future exception={self._exc!r}>"
        return f"<monarch.actor.Future result={self._value!r}>"


def _outcome_when_awaited(f: Future[R]) -> Generator[Any, None, R]:
    """What ``await`` of the resolved ``f`` iterates: its outcome at once, never suspending."""
    return f._outcome()
    yield  # (unreachable: makes this a generator)


def _copy_outcome(f: Future[Any], afut: asyncio.Future[Any]) -> None:
    if afut.done():
        return
    if f._exc is not None:
        afut.set_exception(f._exc)
    else:
        afut.set_result(f._value)


# -- the internal API: how the runtime makes and resolves futures ---------------------------------
#
# ``Future`` is public, and users must not be able to resolve one, so what the runtime's layers
# (collectors, ports, the spawner, the launcher) need lives here as module functions instead of
# methods: a producer makes a ``pending_future()``, hands it out, and later resolves it once with
# ``set_result`` or ``set_exception`` (from any thread). Each function is one call, as a method
# would be: resolution is on the path of every message.


def pending_future() -> Future[Any]:
    """A future with no outcome yet, for a producer to resolve with ``set_result``/``set_exception``."""
    f: Future[Any] = object.__new__(Future)
    f._state = _PENDING
    f._value = None
    f._exc = None
    f._lock = threading.Lock()
    f._waiters = None
    f._callbacks = None
    f._awaiting = None
    f._replies_here = False
    return f


def completed_future(value: R) -> Future[R]:
    """A future that already holds ``value``."""
    f = pending_future()
    f._state, f._value = _DONE, value
    return f


def failed_future(exc: BaseException) -> Future[Any]:
    """A future that already failed with ``exc``."""
    f = pending_future()
    f._state, f._exc = _DONE, exc
    return f


def read_by_waiting_thread(future: Future[Any]) -> None:
    """``future`` is resolved by replies to the calling thread's own reply address: a ``get()``
    on that thread waits by reading them (``set_thread_wait_hook``), not on a lock."""
    future._replies_here = True


#: ``resolve(future, value, exc)``: ``set_result(future, value)`` where ``exc`` is None, else
#: ``set_exception(future, exc)``; one call, for the per-reply path of the collectors.
resolve: Callable[[Future[Any], Any, BaseException | None], bool] = Future._finish


def set_result(future: Future[R], value: R) -> bool:
    """Resolve ``future`` with ``value``; False (and no change) if it was already resolved."""
    return future._finish(value, None)


def set_exception(future: Future[Any], exc: BaseException) -> bool:
    """Fail ``future`` with ``exc``; False (and no change) if it was already resolved."""
    return future._finish(None, exc)


def add_done_callback(future: Future[R], cb: Callable[[Future[R]], None]) -> None:
    """Call ``cb(future)`` once it is resolved, on whichever thread resolves it (now if it is)."""
    with future._lock:
        if future._state != _DONE:
            if future._callbacks is None:
                future._callbacks = []
            future._callbacks.append(cb)
            return
    cb(future)


def outcome(future: Future[R]) -> tuple[R | None, BaseException | None]:
    """``(value, None)`` or ``(None, exception)`` of a resolved ``future``, without raising."""
    return future._value, future._exc


def when_all_succeeded(futures: list[Future[Any]], value: R) -> Future[R]:
    """Resolves with ``value`` once every one of ``futures`` succeeded, or fails with the first
    exception among them (at once, without waiting for the others)."""
    result: Future[R] = pending_future()
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(f: Future[Any]) -> None:
        if f._exc is not None:
            set_exception(result, f._exc)
            return
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            set_result(result, value)

    if not futures:
        set_result(result, value)
    for f in futures:
        add_done_callback(f, one_done)
    return result


def when_all_done(
    futures: list[Future[Any]], deadline_s: float | None = None, on_deadline: Callable[[], None] | None = None
) -> Future[None]:
    """Resolves with None once every one of ``futures`` is resolved, whatever its outcome.

    If ``deadline_s`` passes first, ``on_deadline`` runs (on a timer thread) to make the rest
    resolve, e.g. by killing the processes whose exits they wait for; the wait goes on.
    """
    result: Future[None] = pending_future()
    pending = [f for f in futures if not f.done()]
    if not pending:
        set_result(result, None)
        return result
    left = [len(pending)]
    lock = threading.Lock()
    timer: threading.Timer | None = None
    if deadline_s is not None and on_deadline is not None:
        timer = threading.Timer(deadline_s, on_deadline)
        timer.daemon = True
        timer.start()

    def one_done(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            if timer is not None:
                timer.cancel()
            set_result(result, None)

    for f in pending:
        add_done_callback(f, one_done)
    return result
