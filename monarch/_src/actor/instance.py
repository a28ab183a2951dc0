"""A live actor in this process: its mailbox, where its handlers run, and what a failure does.

One serial mailbox per actor (Monarch 0.7): a message is handled only after the previous one
returned. Actors whose endpoints are ``async def`` run as a task on the runtime loop; actors
with plain ``def`` endpoints get a thread of their own, so a blocking ``Future.get()`` inside
them is legal. That thread is a daemon thread, and so are the threads an actor starts from it,
so a helper thread started in ``__init__`` never keeps the client process alive.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monarch._src.actor.actor import endpoint_table, is_async_actor
from monarch._src.actor.context import (
    SINGLETON_POINT,
    current_instance,
    current_message_rank,
    point_of,
)
from monarch._src.actor.coroutines import COROUTINE_TYPE
from monarch._src.actor.endpoint import EndpointProperty
from monarch._src.actor.errors import (
    ActorError,
    RemoteExceptionPlaceholder,
    SupervisionError,
    add_note,
    format_remote_exception,
)
from monarch._src.actor.future import mark_sync_actor_thread
from monarch._src.actor.port import DROPPING_PORT, Port
from monarch._src.actor.proc_mesh import proc_mesh_reference, stop_actors
from monarch._src.actor.process_state import runtime, this_process
from monarch._src.actor.supervision import (
    actor_failed,
    actor_stopped,
    mark_stopped,
    owned_meshes,
    root_unhandled,
)
from monarch._src.actor.unpickle_off_loop import WAITING_GLOBALS, may_wait, off_loop
from monarch._src.mesh.extent import Extent
from monarch._src.mesh.point import Point
from monarch._src.transport.cork import flush_corked
from monarch._src.wire import payload
from monarch._src.wire.protocol import (
    ACTOR,
    ENDPOINT,
    EXTENT,
    KIND,
    MSG_KIND,
    RANK,
    REPLY_PORT,
    SEQUENCE,
    SHM_MOVED,
)

if TYPE_CHECKING:
    import asyncio

    from monarch._src.runtime.idle_reads import IdleReader

logger = logging.getLogger("monarch.actor")

#: What a mailbox item is: (kind, header, bodies).
INIT, MESSAGE, STOP, SUPERVISE = 0, 1, 2, 3
ROOT_KEY = "root"


class CreatorInstance:
    """A picklable description of the actor that spawned another one."""

    __slots__ = ("name", "actor_id", "description")

    def __init__(self, name: str, actor_id: str, description: str) -> None:
        self.name = name
        self.actor_id = actor_id
        self.description = description

    def __reduce__(self) -> Any:
        return (CreatorInstance, (self.name, self.actor_id, self.description))

    def __str__(self) -> str:
        return self.description

    __repr__ = __str__


class ActorInstance:
    """The running actor (``context().actor_instance``), with its mailbox."""

    def __init__(
        self,
        *,
        key: str,
        name: str,
        cls: type | None,
        rank: Point,
        proc_addresses: tuple[str, ...],
        creator: CreatorInstance | None,
        owner: tuple[str, str] | None = None,
    ) -> None:
        self.key = key
        #: (process address, actor key) of the actor that spawned this mesh: its supervisor.
        self.owner = owner
        self.name = name
        self._cls = cls
        self.rank = rank
        self._proc_addresses = proc_addresses
        self.creator = creator
        self.actor: Any = None
        self.failure: str | None = None
        self.stopped = False
        self.is_async = cls is not None and is_async_actor(cls)
        self._endpoints: dict[str, EndpointProperty[Any]] = endpoint_table(cls) if cls is not None else {}
        self._queue: queue.SimpleQueue[Any] | None = None
        #: A sync actor's messages of the socket read the loop routes now, queued together
        #: once it is routed (``_hand_over``): its thread wakes once per read, not per message.
        self._batch: list[tuple] | None = None
        #: The runtime loop's thread, where an async actor's mailbox is (set with the mailbox).
        self._loop_ident: int | None = None
        #: ``Runtime.after_this_read``, for a sync actor (set with its queue).
        self._after_this_read: Callable[[Callable[[], None]], bool] | None = None
        #: A sync actor's thread reads its peers' connections itself while its mailbox is empty.
        self._idle: IdleReader | None = None
        self._deque: collections.deque[Any] = collections.deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The endpoint being run and since when (``time.monotonic``), for stop reports.
        self._running: str | None = None
        self._running_since = 0.0
        #: Set by a process stop: messages still queued are not run (see ``stop_now``).
        self._stop_now = False
        #: Broadcasts that were never run because the actor stopped, reported to the owner.
        self._unrun: list[str] = []
        #: The sync actor's own thread, where a blocking ``get()`` of a call to itself deadlocks.
        self.thread_ident: int | None = None
        #: The async actor's mailbox task, where ``await`` of a call to itself deadlocks.
        self.mailbox_task: asyncio.Task[Any] | None = None
        #: The thread unpickling a message's arguments now (the mailbox's, or one of its own off
        #: the loop: ``_unpickle_off_loop``), 0 while none does; what they register with
        #: ``when_message_done`` meanwhile waits here until the handler takes it.
        self._decoding = 0
        self._message_done: list[Callable[[], None]] | None = None
        #: What the arguments being unpickled share (``decoding_scratch``), until they are.
        self._decoding_scratch: dict[str, Any] | None = None
        #: ``(rank, labels, sizes, point)`` of the last message's sender (see ``_begin``).
        self._last_point: tuple[Any, Any, Any, Point] = (None, None, None, SINGLETON_POINT)

    # -- identity ---------------------------------------------------------------------------

    @property
    def is_root(self) -> bool:
        """True for the client's root instance, which sends from outside any actor."""
        return self.key == ROOT_KEY

    @property
    def class_name(self) -> str:
        """Module-qualified name of the actor's class, for reprs, log prefixes and error reports."""
        cls = self._cls
        if cls is None:
            return "<root>" if self.is_root else "<unknown class>"
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def actor_id(self) -> str:
        """Unique name of this actor across the job: its process address, mesh key and rank."""
        return f"{runtime().address}/{self.key}[{self.rank.rank}]"

    @property
    def proc_id(self) -> str:
        """Address of the process this actor runs in."""
        return runtime().address

    @property
    def proc_mesh(self) -> Any:
        """A reference to the process mesh this actor was spawned on, to spawn siblings beside it."""
        return proc_mesh_reference(
            self._proc_addresses, Extent(self.rank.extent.labels, self.rank.extent.sizes)
        )

    @property
    def proc(self) -> Any:
        """The single-process slice of ``proc_mesh`` this actor runs in, to spawn actors next to it."""
        return self.proc_mesh.slice(**dict(self.rank))

    def __str__(self) -> str:
        if self.is_root:
            return "<root>"
        parent = self.creator.description if self.creator is not None else "<root>"
        return f"{parent}.<{self.class_name} {self.name}{self.rank!r}>"

    def __repr__(self) -> str:
        return str(self)

    @property
    def running_endpoint(self) -> str | None:
        """The endpoint this actor is running now, if any."""
        return self._running

    def as_creator(self) -> CreatorInstance:
        """The picklable identity of this instance that its child actors keep as their creator."""
        return CreatorInstance("root" if self.is_root else self.name, self.actor_id, str(self))

    # -- mailbox ----------------------------------------------------------------------------

    def enqueue_init(self, init: tuple) -> None:
        """Queue ``__init__`` first, before any message can be queued (call before registering)."""
        rt = runtime()
        self._loop_ident = rt.loop_thread.ident
        if self.is_async:
            self._deque.append((INIT, None, init))
        else:
            self._queue = queue.SimpleQueue()
            self._queue.put((INIT, None, init))
            self._after_this_read = rt.after_this_read
            if rt.idle_reads.enabled:
                from monarch._src.runtime.idle_reads import IdleReader  # (the runtime is up)

                self._idle = IdleReader(rt.idle_reads, deliver_on_thread)

    def start(self) -> None:
        """Begin processing the mailbox (``__init__`` first)."""
        if self.is_async:
            rt = runtime()
            rt.loop_thread.call_soon(self._start_task)
        else:
            thread = threading.Thread(
                target=self._thread_main, name=f"monarch-actor-{self.name}", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as e:  # e.g. the process's thread or memory limit is reached
                self._failed(
                    f"its thread could not be started ({e}), so it never ran.\n"
                    "HINT: the process may be at its thread limit (ulimit -u, the cgroup's pids.max) "
                    "or out of memory for another thread stack."
                )
                if self._idle is not None:
                    self._idle.close()
                self._stopped(None)

    def post_message(self, header: dict, bodies: list | tuple[tuple, dict]) -> None:
        """Queue a message: its pickled bodies, or (args, kwargs) as they are from this process."""
        self.put((MESSAGE, header, bodies))

    def put(self, item: tuple) -> None:
        """Queue a message, stop or supervision event in this actor's mailbox, run in arrival order."""
        q = self._queue
        if q is not None:
            batch = self._batch
            if batch is None:
                if self._after_this_read(self._hand_over):  # type: ignore[misc]  # set with q
                    self._batch = [item]
                    return
            elif threading.get_ident() == self._loop_ident:  # a batch exists while the loop routes a read
                batch.append(item)
                return
            q.put(item)
            if self._idle is not None:
                self._idle.wake()
            if self.stopped:  # raced with the stop: nobody will take it from the queue
                self._report_unrun(self._reject_queued())
            return
        if threading.get_ident() == self._loop_ident:  # (None: not set up to run anything yet)
            self._put_on_loop(item)
        else:
            runtime().loop.call_soon_threadsafe(self._put_on_loop, item)

    def _hand_over(self) -> None:
        """(loop thread) Queue the messages of the read just routed for this actor's thread."""
        batch, self._batch = self._batch, None
        q = self._queue
        for item in batch or ():
            q.put(item)  # type: ignore[union-attr]
        idle = self._idle
        if idle is not None:
            idle.claim()
            idle.wake()
        if self.stopped:  # raced with the stop: nobody will take them from the queue
            self._report_unrun(self._reject_queued())

    def _put_on_loop(self, item: tuple) -> None:
        self._deque.append(item)
        if self.stopped:
            self._report_unrun(self._reject_queued())
            return
        w = self._wakeup
        if w is not None and not w.done():
            w.set_result(None)

    def _reject_queued(self) -> list[str]:
        """Answer what is left in the mailbox of a stopped actor, so no caller waits forever;
        returns the endpoints of the broadcasts that will never run (nobody waits for those)."""
        unrun: list[str] = []
        while True:
            try:
                kind, header, _ = (
                    self._queue.get_nowait() if self._queue is not None else self._deque.popleft()
                )
            except (queue.Empty, IndexError):
                return unrun
            if kind == MESSAGE:
                self._not_run(header, unrun)
            elif kind == STOP:
                self._stopped(header)

    def _not_run(self, header: dict, unrun: list[str]) -> None:
        """A message this actor will never run: a call fails its caller, a broadcast is listed."""
        spec = header.get(REPLY_PORT)
        if spec:
            Port(spec[0], spec[1], header.get(RANK)).exception(self._unavailable_error(header[ENDPOINT]))
        else:
            unrun.append(header[ENDPOINT])

    def _report_unrun(self, unrun: list[str]) -> None:
        """Tell the owner about broadcasts that reached this actor after it stopped."""
        if unrun:
            actor_stopped(self, unrun_report(str(self), unrun))

    # -- runners ----------------------------------------------------------------------------

    def _thread_main(self) -> None:
        mark_sync_actor_thread()
        self.thread_ident = threading.get_ident()
        current_instance.set(self)
        q = self._queue
        assert q is not None
        idle = self._idle
        queued = _not_empty(q)
        while True:
            if q.empty():
                flush_corked()  # replies corked in a burst go out before this thread sleeps
                if idle is not None:
                    idle.wait(queued)  # reading its messages itself meanwhile
            kind, header, bodies = q.get()  # this thread alone takes from the queue
            if kind == MESSAGE:
                self._handle_sync(header, bodies)
                self._running = None
            elif kind == INIT:
                self._construct(bodies)
            elif kind == SUPERVISE:
                pending = self._supervise_step(header, self.actor.__supervise__, header)
                if pending is not None:  # async __supervise__ runs on the loop
                    self._supervise_step(header, _run_on_loop, pending)
            else:
                self._stop_sync(header)
                if idle is not None:
                    idle.close()
                return

    def _start_task(self) -> None:
        loop = runtime().loop
        loop.create_task(self._task_main(), name=f"monarch-actor-{self.name}")

    async def _task_main(self) -> None:
        import asyncio

        current_instance.set(self)
        self.mailbox_task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        dq = self._deque
        while True:
            while not dq:
                self._wakeup = loop.create_future()
                await self._wakeup
            kind, header, bodies = dq.popleft()
            if kind == MESSAGE:
                if WAITING_GLOBALS and self._unpickling_may_wait(bodies):
                    bodies = await _settled(self._unpickle_off_loop(header, bodies))
                # Started here, not in a method of its own: one Python call less per message.
                fn, args, kwargs, reply, explicit = self._begin(header, bodies)
                done, self._message_done = self._message_done, None  # as in _handle_sync
                self._decoding_scratch = None
                if fn is None:
                    _run_callbacks(done)
                else:
                    # The arguments are the coroutine's alone now: it drops them before replying.
                    run = self._run_async(fn, args, kwargs, reply, explicit, header[ENDPOINT], done)
                    args = kwargs = None
                    prop = self._endpoints.get(header[ENDPOINT])
                    if prop is None or not prop.concurrent:
                        await run  # the endpoint's run, before the next message
                    else:
                        task = loop.create_task(run)
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                        await asyncio.sleep(0)  # start-order guarantee: it runs until its first await
                self._running = None
            elif kind == INIT:
                self._construct(bodies)
            elif kind == SUPERVISE:
                pending = self._supervise_step(header, self.actor.__supervise__, header)
                if pending is not None:
                    self._supervise_step(header, await _settled(pending))
            else:
                await self._stop_async(header)
                return

    # -- handling ---------------------------------------------------------------------------

    def _construct(self, init: tuple) -> None:
        current_message_rank.set(self.rank)
        cls, args, kwargs = init
        try:
            if cls is None:
                raise args  # the spawn message could not be unpickled here
            if this_process.boot_failure is not None:
                raise _boot_failed(this_process.boot_failure)
            obj = cls.__new__(cls)
            obj.__init__(*args, **kwargs)
            self.actor = obj
        except BaseException as e:  # noqa: B036 - any failure in __init__ fails the actor
            self._fail(e, "__init__")

    def _unpickling_may_wait(self, bodies: list | tuple[tuple, dict]) -> bool:
        """Whether this async actor's message must be unpickled off the loop: its arguments
        may wait as they unpickle, and it is to be run (``_begin`` unpickles nothing else)."""
        return type(bodies) is list and may_wait(bodies) and self.failure is None and not self._stop_now

    async def _unpickle_off_loop(self, header: dict, bodies: list) -> tuple[tuple, dict]:
        """(mailbox task) Unpickle an async actor's message on a thread (``unpickle_off_loop``),
        the mailbox awaiting it, so no later message starts before it."""
        self._running, self._running_since = header[ENDPOINT], time.monotonic()  # (for stop reports)

        def unpickle() -> tuple[tuple, dict]:
            self._decoding = threading.get_ident()
            try:
                return payload.loads(bodies)  # type: ignore[no-any-return]
            finally:
                self._decoding = 0

        arguments = await off_loop(unpickle, f"monarch-unpickle-{self.name}")
        bodies.clear()  # the arguments own their buffers now; see _handle_sync
        return arguments

    def _begin(
        self, header: dict, bodies: list | tuple[tuple, dict] | Callable[[], tuple[tuple, dict]]
    ) -> tuple[Callable[..., Any] | None, Any, Any, Port[Any] | None, bool]:
        """Mark the message running and decode it; returns (function, args, kwargs, reply port,
        explicit_port), the function None if there is nothing to run: a process stop means it
        is not run, or the actor failed, or its arguments did not unpickle (each answered here).
        ``bodies``: pickled, or (args, kwargs) as they are from this process, or what gives
        them once unpickled off the loop."""
        name = header[ENDPOINT]
        if self._stop_now:
            self._not_run(header, self._unrun)
            return None, None, None, None, False
        self._running, self._running_since = name, time.monotonic()
        labels, sizes = header[EXTENT]
        r = header[RANK]
        last = self._last_point  # most messages come from the rank and mesh the last one did
        if last[0] == r and last[1] == labels and last[2] == sizes:
            point = last[3]
        else:
            point = point_of(r, labels, sizes) if labels else SINGLETON_POINT
            self._last_point = (r, labels, sizes, point)
        current_message_rank.set(point)
        spec = header.get(REPLY_PORT)
        reply: Port[Any] | None = Port(spec[0], spec[1], r) if spec else None
        if self.failure is not None or self.actor is None:
            if reply is not None:
                reply.exception(self._unavailable_error(name))
            return None, None, None, None, False
        prop = self._endpoints.get(name)
        try:
            if isinstance(bodies, tuple):  # immutable arguments from this process, as they are
                args, kwargs = bodies
            elif isinstance(bodies, list):
                self._decoding = threading.get_ident()
                try:
                    args, kwargs = payload.loads(bodies)
                finally:
                    self._decoding = 0
                bodies.clear()  # the arguments own their buffers now; see _handle_sync
            else:  # unpickled off the loop (``_settled``): its arguments, or its error raised here
                args, kwargs = bodies()
            if prop is not None:
                fn, explicit = prop.method, prop.explicit_response_port
            else:
                fn, explicit = getattr(type(self.actor), name), False
        except Exception as e:
            if reply is not None:
                self._reply_error(reply, name, e)
            else:  # a broadcast: nobody waits for it, so its owner must hear that it never ran
                _drop_runtime_frames(e)
                self._failed(
                    f"a broadcast of endpoint {name} could not be run:\n{format_remote_exception(e)}"
                )
            return None, None, None, None, False
        if explicit:
            args = (reply if reply is not None else DROPPING_PORT, *args)
        return fn, args, kwargs, reply, explicit

    def _handle_sync(self, header: dict, bodies: list | tuple[tuple, dict]) -> None:
        fn, args, kwargs, reply, explicit = self._begin(header, bodies)
        # What the arguments just unpickled asked to run when their message ends.
        done, self._message_done = self._message_done, None
        self._decoding_scratch = None
        if fn is None:
            _run_callbacks(done)
            return
        try:
            result = fn(self.actor, *args, **kwargs)
            # Arguments die before the reply leaves, so shared-memory buffers they mapped are
            # given back to their sender ahead of the reply (and it can reuse them at once).
            args = kwargs = None
            if type(result) not in _PLAIN_RESULTS and _is_awaitable(result):  # an async method (as_endpoint)
                result = _run_on_loop(result)
        except Exception as e:
            self._endpoint_raised(header[ENDPOINT], e, reply, explicit)
        except BaseException as e:
            self._fail(e, f"endpoint {header[ENDPOINT]}")
            if reply is not None:
                reply.exception(self._unavailable_error(header[ENDPOINT]))
        else:
            self._reply(reply, explicit, header[ENDPOINT], result)
        finally:
            if done is not None:
                _run_callbacks(done)

    async def _run_async(
        self,
        fn: Callable[..., Any],
        args: Any,
        kwargs: Any,
        reply: Port[Any] | None,
        explicit: bool,
        name: str,
        done: list[Callable[[], None]] | None,
    ) -> None:
        import asyncio

        try:
            result = fn(self.actor, *args, **kwargs)
            args = kwargs = None  # see _handle_sync
            if result.__class__ is COROUTINE_TYPE or _is_awaitable(result):  # (an async def: inline)
                result = await result
        except Exception as e:
            self._endpoint_raised(name, e, reply, explicit)
        except asyncio.CancelledError:
            if reply is not None and not explicit:
                reply.exception(
                    SupervisionError(f"Endpoint call {self.name}.{name}() was cancelled: the actor stopped")
                )
            raise
        except BaseException as e:
            self._fail(e, f"endpoint {name}")
            if reply is not None:
                reply.exception(self._unavailable_error(name))
        else:
            self._reply(reply, explicit, name, result)
        finally:
            if done is not None:
                _run_callbacks(done)

    def _reply(self, reply: Port[Any] | None, explicit: bool, name: str, result: Any) -> None:
        if reply is None or explicit:
            return
        try:
            reply.send(result)
        except Exception as e:  # the result could not be pickled or sent
            if not isinstance(e, OSError):  # (a send fails with an OSError; the rest is pickling)
                _drop_pickling_frames(e)
                add_note(
                    e,
                    f"(pickling the {type(result).__name__} that {self.name}.{name} returned)\n"
                    "HINT: an endpoint's return value must be picklable by cloudpickle; return "
                    "plain data (e.g. a list, not a generator; no locks, sockets or open files).",
                )
            self._reply_error(reply, name, e)

    def _endpoint_raised(self, name: str, e: Exception, reply: Port[Any] | None, explicit: bool) -> None:
        if reply is not None and not explicit:
            self._reply_error(reply, name, e)
        else:
            # Nobody is waiting for this result (broadcast, or an explicit-port endpoint):
            # the failure must go to the supervision tree instead of vanishing.
            self._fail(e, f"endpoint {name}")
            if reply is not None:
                reply.exception(self._unavailable_error(name))

    def _reply_error(self, reply: Port[Any], name: str, e: BaseException) -> None:
        _drop_runtime_frames(e)
        message = f"Actor call {self.name}.{name} failed."
        err = ActorError(e, message)
        try:
            reply.exception(err)
        except Exception:
            reply.exception(
                ActorError(
                    RemoteExceptionPlaceholder(f"{type(e).__name__}: {e}"), message, err.exception_formatted
                )
            )

    def _unavailable_error(self, endpoint: str) -> SupervisionError:
        if self.failure is not None:
            return SupervisionError(f"Endpoint call {self.name}.{endpoint}() failed, {self.failure}")
        return SupervisionError(f"Endpoint call {self.name}.{endpoint}() failed, the actor has been stopped")

    def _fail(self, e: BaseException, during: str) -> None:
        _drop_runtime_frames(e)
        self._failed(f"{during} raised:\n{format_remote_exception(e)}")

    def _failed(self, what: str) -> None:
        if self.failure is not None:
            return
        self.failure = f"The actor {self} and all its descendants have failed: {what}"
        actor_failed(self, self.failure)

    # -- supervising the meshes this actor owns ---------------------------------------------

    def supervise(self, failure: Any) -> None:
        """A mesh this actor owns failed: ``__supervise__`` decides, else this actor fails."""
        if self.is_root:
            root_unhandled(failure)
        elif self.failure is None and getattr(self.actor, "__supervise__", None) is not None:
            self.put((SUPERVISE, failure, None))
        else:
            self._supervised(failure, False)

    def _supervise_step(self, failure: Any, step: Callable[..., Any], *args: Any) -> Any:
        """One step of supervising ``failure``: ``__supervise__`` itself, or the wait for the
        awaitable it returned. What the step raises or returns is acted on here, except an
        awaitable, returned for the runner to wait on (on the loop, or awaited)."""
        try:
            handled = step(*args)
        except BaseException as e:  # noqa: B036 - reported, never silently lost
            self._supervise_raised(failure, e)
            return None
        if _is_awaitable(handled):
            return handled
        self._supervised(failure, handled)
        return None

    def _supervised(self, failure: Any, handled: Any) -> None:
        if not handled:
            self._failed(f"a mesh it owns failed and was not handled: {failure.report()}")

    def _supervise_raised(self, failure: Any, e: BaseException) -> None:
        self._failed(
            f"__supervise__ raised:\n{format_remote_exception(e)}\n"
            f"This error occurred while handling another failure:\n{failure.report()}"
        )

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor after the messages already queued (graceful self-stop)."""
        self.put((STOP, None, None))

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor now; the failure goes to its owner."""
        self._failed(f"aborted: {reason if reason is not None else 'no reason provided'}")

    kill = abort

    # -- stopping ---------------------------------------------------------------------------

    def _stop_owned_meshes(self) -> list[Any]:
        """Stopping an actor stops the meshes it owns first (their ``__cleanup__`` runs first)."""
        futures = []
        for key, name, addresses in owned_meshes(self.key):
            mark_stopped(key, f"its owner {self.name} stopped")
            if addresses:
                futures.append(stop_actors(key, addresses, name))
        return futures

    def stop_now(self, done: Callable[[], None]) -> None:
        """Stop as soon as the running endpoint returns: what is still queued is not run
        (callers get an error, the owner hears of broadcasts); ``done`` once stopped."""
        self._stop_now = True
        self.put((STOP, {"done": done}, None))

    def activity(self) -> str:
        """What keeps this actor from stopping, for stop reports (asked while a stop is queued,
        which is not counted among the messages queued)."""
        running = self._running
        queued = (self._queue.qsize() if self._queue is not None else len(self._deque)) - 1
        if running is not None:
            what = (
                f"is still running endpoint {running}() (for {time.monotonic() - self._running_since:.1f} s)"
            )
        elif self.actor is None and self.failure is None:
            what = "is still running __init__"
        else:
            what = "is still stopping (its owned meshes or __cleanup__)"
        behind = f", with {queued} message(s) queued behind it" if queued > 0 else ""
        return f"The actor {self} {what}{behind}"

    def stop_overdue(self, header: dict, timeout: float) -> None:
        """The stop in ``header`` was not done within ``timeout``: tell its sender why, now."""
        spec = header.pop(REPLY_PORT, None)  # whoever pops it answers the stop: this, or _stopped
        if not spec:
            return
        port: Port[None] = Port(spec[0], spec[1], header.get(RANK))
        if self.stopped:  # it stopped just now, before _stopped got to the answer
            port.send(None)
            return
        port.exception(
            SupervisionError(
                f"{self.activity()}; it did not stop within {timeout:g} s and stops once that returns."
            )
        )

    def _stop_sync(self, header: dict | None) -> None:
        for f in self._stop_owned_meshes():
            try:
                f.get(timeout=cleanup_timeout())
            except Exception as e:  # the owned mesh is marked stopped here either way
                logger.warning("stopping a mesh owned by %s: %s", self, e)
        cleanup = getattr(self.actor, "__cleanup__", None)
        if cleanup is not None:
            try:
                cleanup(None)
            except Exception as e:
                self._fail(e, "__cleanup__")
        self._stopped(header)

    async def _stop_async(self, header: dict | None) -> None:
        import asyncio

        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        owned = self._stop_owned_meshes()
        if owned:
            stops = [asyncio.ensure_future(_await(f)) for f in owned]
            finished, _ = await asyncio.wait(stops, timeout=cleanup_timeout())
            for t in finished:
                if t.exception() is not None:  # the owned mesh is marked stopped here either way
                    logger.warning("stopping a mesh owned by %s: %s", self, t.exception())
        cleanup = getattr(self.actor, "__cleanup__", None)
        if cleanup is not None:
            try:
                await cleanup(None)
            except Exception as e:
                self._fail(e, "__cleanup__")
        self._stopped(header)

    def _stopped(self, header: dict | None) -> None:
        if not self.stopped:
            self.stopped = True
            this_process.unregister_actor(self)
            # What the actor holds (a model, GPU memory) is freed now, not whenever the last
            # reference to this instance goes (a timer, a stale reference to the mesh).
            self.actor = None
            unrun = self._unrun + self._reject_queued()
            actor_stopped(self, unrun_report(str(self), unrun) if unrun else None)
        spec = header.pop(REPLY_PORT, None) if header else None  # None: stop_overdue answered already
        if spec:
            assert header is not None  # spec came from it
            ack: Port[None] = Port(spec[0], spec[1], header.get(RANK))  # the stop is acknowledged, no value
            ack.send(None)
        done = header.get("done") if header else None
        if done is not None:
            done()


def _not_empty(q: queue.SimpleQueue[Any]) -> Callable[[], bool]:
    return lambda: not q.empty()


def deliver_on_thread(header: dict, bodies: list) -> bool:
    """A frame read by an idle sync actor's thread (``idle_reads``): a message for a sync actor
    of this process goes straight to its mailbox, as the loop would put it; anything else (a
    broadcast's ordered frame, shared memory to map, an actor not here) is the loop's (False)."""
    if header.get(KIND) != MSG_KIND or SEQUENCE in header or SHM_MOVED in header:
        return False
    inst = this_process.actors.get(header[ACTOR])
    if inst is None or inst._queue is None:
        return False
    inst.put((MESSAGE, header, bodies))
    return True


def when_message_done(callback: Callable[[], None]) -> bool:
    """Run ``callback`` (which must not raise) when the message whose arguments this process is
    unpickling now ends: its endpoint returned or raised, or its arguments failed to unpickle.
    An argument that lends the actor something of its process for the call (a distributed
    tensor's shard) gives it back so. False, with nothing registered, outside such unpickling."""
    inst = current_instance.get()
    if inst is None or inst._decoding != threading.get_ident():
        return False
    if inst._message_done is None:
        inst._message_done = []
    inst._message_done.append(callback)
    return True


def decoding_scratch() -> dict[str, Any] | None:
    """A dict the arguments of the message this process is unpickling now share, for those
    that must know of each other (a call's distributed tensors: the batches the last one waits
    for, none of their lent shards may hold back); None outside such unpickling."""
    inst = current_instance.get()
    if inst is None or inst._decoding != threading.get_ident():
        return None
    if inst._decoding_scratch is None:
        inst._decoding_scratch = {}
    return inst._decoding_scratch


def _run_callbacks(callbacks: list[Callable[[], None]] | None) -> None:
    if callbacks is not None:
        for callback in callbacks:
            callback()


def may_still_run(key: str) -> bool:
    """Whether the actor ``key`` of this process may still run a message sent to it: it is
    here (or its spawn is awaited), neither stopped nor failed."""
    inst = this_process.lookup(key)
    if inst is None:
        return key in this_process.early
    return not inst.stopped and inst.failure is None


def unrun_report(actor: str, endpoints: list[str]) -> str:
    """What the owner is told of broadcasts an actor never ran: "... 3 broadcast(s): f() x2, g() x1"."""
    counts = ", ".join(f"{n}() x{c}" for n, c in collections.Counter(endpoints).items())
    return f"The actor {actor} stopped before it ran {len(endpoints)} broadcast(s): {counts}."


def _boot_failed(cause: BaseException) -> RuntimeError:
    """Why no actor is constructed in a process whose spawn-time ``bootstrap`` raised: what it
    set up (environment, devices) is missing, so the failure must not pass unseen."""
    error = RuntimeError(
        f"this process's spawn-time bootstrap function raised {cause!r}, so no actor is constructed "
        "here\nHINT: `proc_mesh.initialized.get()` (or `await proc_mesh.initialized`) raises the "
        "bootstrap's error before any spawn; fix the bootstrap function."
    )
    error.__cause__ = cause
    return error


def cleanup_timeout() -> float:
    from monarch._src.runtime.config import CONFIG

    return CONFIG.cleanup_timeout_s


def _run_on_loop(awaitable: Any) -> Any:
    """Run an awaitable on the runtime loop from an actor's own thread, and wait for it."""
    import asyncio

    return asyncio.run_coroutine_threadsafe(_await(awaitable), runtime().loop).result()


#: Result types that are never awaitable: most endpoints return these, and ``hasattr`` on them
#: costs a failed attribute lookup per message.
_PLAIN_RESULTS = frozenset({type(None), int, float, str, bytes, bool, tuple, list, dict})


def _is_awaitable(value: Any) -> bool:
    t = type(value)
    if t is COROUTINE_TYPE:
        return True
    if t in _PLAIN_RESULTS:
        return False
    return hasattr(value, "__await__")


def _drop_runtime_frames(e: BaseException) -> None:
    """Start the remote traceback at the user's code, not at the dispatcher calling it."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    if tb is not None:
        e.__traceback__ = tb


def _drop_pickling_frames(e: BaseException) -> None:
    """Start the traceback of a failed pickling at the user's code (a ``__reduce__`` or
    ``__getstate__`` that raised), or drop it where there is none: the runtime's and the
    pickler's own frames tell the user nothing."""
    import pickle

    import cloudpickle  # (here, not at start-up: a failed pickling is rare)

    import monarch._src as runtime_package

    roots = (
        os.path.dirname(runtime_package.__file__),
        os.path.dirname(cloudpickle.__file__),
        pickle.__file__,
    )
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(roots):
        tb = tb.tb_next
    e.__traceback__ = tb


async def _settled(aw: Any) -> Callable[[], Any]:
    """Wait for ``aw``; returns what gives its result, or raises its exception, when called."""
    try:
        value = await aw
    except BaseException as e:  # noqa: B036 - raised again by the caller, where it is reported
        error = e  # ``e`` itself is unbound once the block ends

        def reraise() -> Any:
            raise error

        return reraise
    return lambda: value


async def _await(aw: Any) -> Any:
    return await aw


def root_instance() -> ActorInstance:
    """The client's root actor: the context of code running outside any actor."""
    root = this_process.root
    if root is None:
        with this_process.root_lock:
            root = this_process.root
            if root is None:
                root = this_process.root = ActorInstance(
                    key=ROOT_KEY,
                    name="root",
                    cls=None,
                    rank=SINGLETON_POINT,
                    proc_addresses=(runtime().address,),
                    creator=None,
                )
    return root
