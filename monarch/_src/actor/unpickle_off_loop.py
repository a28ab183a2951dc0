"""Messages whose arguments may wait as they unpickle, unpickled off the event loop.

Some arguments wait, while they unpickle, for work of the process they arrive in: a distributed
tensor waits until its proc's tensor worker ran the ops issued before the call, and a shard
lent to a call still running holds those back until that call ends (for minutes, at worst). A
sync actor unpickles on its own thread, where such a wait stalls that actor alone. An async
actor's mailbox runs on the process's event loop: waiting there would stall every actor and
every reply of the process, and a running call holding the shard, which needs the loop to end,
could never end (the process hung until the lend timed out). So an async actor's message that
may wait is unpickled on a thread of its own while its mailbox awaits it; the messages behind
it still start only after it. A value sent to a port of such a process is decoded on the
runtime's loop (or the loop reading its replies) just as well: one that may wait is unpickled on
a thread too, and the values sent to that port after it are delivered after it
(``port._deliver``); other ports' values do not wait for it.

Which messages may wait is read from the pickle stream: it names every global it calls, by
module and name, and the layer whose arguments wait names its global here
(``unpickling_may_wait``). A process where no layer did pays one check per message, and a
message whose stream names none of them unpickles on the loop as ever.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: The names of the globals (functions) that may wait when an unpickled stream calls them.
WAITING_GLOBALS: list[bytes] = []


def unpickling_may_wait(fn: Callable[..., Any]) -> None:
    """Unpickle off the loop the async actors' messages whose streams call ``fn``."""
    name = fn.__qualname__.encode()
    if name not in WAITING_GLOBALS:
        WAITING_GLOBALS.append(name)


def may_wait(bodies: list) -> bool:
    """Whether unpickling ``bodies`` (a message's pickle stream and its out-of-band buffers)
    may wait: its stream names a waiting global. A stream that cannot be searched in place (a
    mapped shared-memory file) is taken to, which costs it a thread, never a wait on the loop."""
    if not bodies:
        return False
    stream = bodies[0]
    if type(stream) is not bytearray and type(stream) is not bytes:
        return True
    for name in WAITING_GLOBALS:  # (a loop: a generator costs more than the search)
        if name in stream:
            return True
    return False


async def off_loop(work: Callable[[], T], thread_name: str) -> T:
    """Run ``work`` on a thread of its own, in this context (it sees the actor it works for),
    and wait for its result (or exception) without blocking the loop. A thread of its own, not
    a pool's: each waits for its process's work, which may wait in turn for a message behind
    another waiting one (a pool could be full of those), and an actor's mailbox has at most
    one of them at a time."""
    import asyncio

    loop = asyncio.get_running_loop()
    settled: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def run() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(work)
        except BaseException as e:  # noqa: B036 - raised again in the awaiting task
            error = e
        try:
            loop.call_soon_threadsafe(_settle, settled, value, error)
        except RuntimeError:  # the loop closed meanwhile: nobody waits for it any more
            pass

    start_thread(run, thread_name)
    return await settled


def start_thread(run: Callable[[], None], thread_name: str) -> None:
    """Start ``run`` on a daemon thread of its own (it may wait for minutes: nothing joins it).
    Raises RuntimeError, saying why and what to do, if no thread can be started."""
    try:
        threading.Thread(target=run, name=thread_name, daemon=True).start()
    except RuntimeError as e:  # e.g. the process's thread or memory limit is reached
        raise RuntimeError(
            f"no thread could be started to unpickle a message ({e}); it may wait for work of "
            "this process, which must not block its event loop\n"
            "HINT: the process may be at its thread limit (ulimit -u, the cgroup's pids.max) or out "
            "of memory for another thread stack."
        ) from e


def _settle(settled: Any, value: Any, error: BaseException | None) -> None:
    if settled.done():  # the awaiting mailbox task was cancelled
        return
    if error is None:
        settled.set_result(value)
    elif isinstance(error, StopIteration):  # which a future refuses to hold
        settled.set_exception(RuntimeError(f"unpickling raised {error!r}"))
    else:
        settled.set_exception(error)
