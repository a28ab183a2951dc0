"""What this machine allows, before any framework: the floor the actor benchmarks are read against.

    .venv/bin/python benchmarks/bench_floor.py [--rounds 5] [--metrics a,b] [--out FILE]

The floor runs the actor benchmarks' messaging workloads (`_benchutil.METRICS`, same keys)
with nothing but uvloop, msgpack and the standard library: each worker process echoes
length-prefixed msgpack messages ``[request id, value]`` on a Unix socket, read by an
``asyncio.BufferedProtocol``; the client awaits a future per request on its own loop (uvloop
unless ``--client-loop asyncio``).

* ``rt_sync_us``, ``rt_await_us``: one request to one worker, awaited, and again (the floor has
  one way of waiting, so both round trips are measured the same way);
* ``gather_per_s``, ``gather_await_per_s``: one request to each of 4 workers, gathered;
* ``outstanding_calls_per_s``: 10,000 requests written before the first reply is awaited;
* ``inproc_rt_us``, ``inproc_rt_await_us``: an in-process actor: a task reading an
  ``asyncio.Queue`` mailbox on the caller's loop and resolving the caller's future;
* ``process_pingpong_us``, ``thread_pingpong_us``: the wake-ups themselves, one byte to a
  forked process and back over a socketpair, two threads handing a lock back and forth;
* ``loop_thread_pingpong_us``: a coroutine awaiting a thread: it queues a value for the thread,
  which hands it back with ``call_soon_threadsafe`` (asyncio's own loop, as
  ``inproc_rt_await_us`` awaits a sync actor of its process: the least such an await costs).

Prints one JSON object in `_benchutil.Recorder`'s format as its last line, so
``run_all.py --floor`` runs it beside monarch-aio and prints monarch-aio's ratio to each figure.
"""

from __future__ import annotations

import asyncio
import os
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu

#: Little-endian length of the msgpack body that follows.
PREFIX = struct.Struct("<I")
OUTSTANDING = 10_000
GATHER_PROCS = 4


class FramedProtocol(asyncio.BufferedProtocol):
    """Reads length-prefixed msgpack messages and hands each one to ``on_message``, in order."""

    def __init__(self, on_message: Callable[[Any], None], on_batch_end: Callable[[], None] | None = None):
        import msgpack

        self._unpack = msgpack.unpackb
        self._on_message = on_message
        self._on_batch_end = on_batch_end
        self._buf = bytearray(256 * 1024)
        self._start = self._end = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._end == len(self._buf):
            live = self._end - self._start
            self._buf[:live] = self._buf[self._start : self._end]
            self._start, self._end = 0, live
            if live == len(self._buf):
                self._buf.extend(bytes(len(self._buf)))
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        buf, pos, end = self._buf, self._start, self._end
        while end - pos >= 4:
            (n,) = PREFIX.unpack_from(buf, pos)
            if end - pos - 4 < n:
                break
            self._on_message(self._unpack(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        self._start = pos
        if pos == end:
            self._start = self._end = 0
        if self._on_batch_end is not None:
            self._on_batch_end()

    def connection_lost(self, exc: Exception | None) -> None:
        pass


def _frame(message: Any) -> bytes:
    import msgpack

    body = msgpack.packb(message)
    return PREFIX.pack(len(body)) + body


# -- the worker process ---------------------------------------------------------------------------


def serve(fd: int) -> None:
    """Echo every message on the socket ``fd`` until it closes; replies to one read are written
    together, as any server would."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()
        replies: list[bytes] = []

        class Echo(FramedProtocol):
            def connection_lost(self, exc: Exception | None) -> None:
                closed.set_result(None)

        def flush() -> None:
            if replies:
                proto.transport.write(b"".join(replies))  # type: ignore[union-attr]
                replies.clear()

        proto = Echo(lambda m: replies.append(_frame(m)), flush)
        await loop.connect_accepted_socket(lambda: proto, socket.socket(fileno=fd))
        await closed

    uvloop.run(main())


# -- the client -----------------------------------------------------------------------------------


class Worker:
    """One echoing worker process and the client's connection to it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve-fd", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
        )
        theirs.close()
        self._sock = ours
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self.proto: FramedProtocol | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        self.loop = loop
        self._closed = loop.create_future()
        self.proto = FramedProtocol(self._reply)
        self.proto.connection_lost = lambda exc: self._closed.set_result(None)  # type: ignore[method-assign]
        await loop.connect_accepted_socket(lambda: self.proto, self._sock)

    def _reply(self, message: Any) -> None:
        self._waiting.pop(message[0]).set_result(message[1])

    def call(self, value: Any) -> asyncio.Future[Any]:
        self._next_id += 1
        fut = self.loop.create_future()
        self._waiting[self._next_id] = fut
        self.proto.transport.write(_frame([self._next_id, value]))  # type: ignore[union-attr]
        return fut

    async def stop(self) -> None:
        """Close the connection; the worker exits at its end."""
        self.proto.transport.close()  # type: ignore[union-attr]
        await self._closed
        self.proc.wait(timeout=10)


class Floor:
    """The workloads; each metric runs its rounds inside one event loop (``--client-loop``)."""

    def __init__(self, args: Any) -> None:
        self.args = args

    def _rounds(
        self, setup: Callable[[], Awaitable[Any]], one: Callable[[Any], Awaitable[float]]
    ) -> list[float]:
        async def main() -> list[float]:
            state = await setup()
            out: list[float] = []
            try:
                for warm, _ in bu.rounds(self.args):
                    x = await one(state)
                    if not warm:
                        out.append(x)
            finally:
                for w in state if isinstance(state, list) else []:
                    await w.stop()
            return out

        return bu.run_coroutine(self.args, main())

    async def _workers(self, n: int) -> list[Worker]:
        workers = [Worker() for _ in range(n)]
        for w in workers:
            await w.connect()
        for w in workers:
            await w.call(0)  # the worker is up and its loop runs
        return workers

    def round_trip_us(self) -> list[float]:
        async def one(workers: list[Worker]) -> float:
            call = workers[0].call
            return await bu.timed_loop_async(call, 2000, self.args.loop_s) * 1e6

        return self._rounds(lambda: self._workers(1), one)

    def gather_per_s(self) -> list[float]:
        async def one(workers: list[Worker]) -> float:
            def gather(i: int) -> Awaitable[Any]:
                return asyncio.gather(*[w.call(i) for w in workers])

            return 1.0 / await bu.timed_loop_async(gather, 2000, self.args.loop_s)

        return self._rounds(lambda: self._workers(GATHER_PROCS), one)

    def outstanding_per_s(self) -> list[float]:
        async def one(workers: list[Worker]) -> float:
            call = workers[0].call
            t = time.perf_counter()
            futs = [call(i) for i in range(OUTSTANDING)]
            for f in futs:
                await f
            return OUTSTANDING / (time.perf_counter() - t)

        return self._rounds(lambda: self._workers(1), one)

    def inproc_rt_us(self) -> list[float]:
        async def setup() -> tuple[asyncio.Queue, asyncio.Task]:
            mailbox: asyncio.Queue[tuple[Any, asyncio.Future[Any]]] = asyncio.Queue()

            async def actor() -> None:
                while True:
                    value, reply = await mailbox.get()
                    reply.set_result(value)

            return mailbox, asyncio.get_running_loop().create_task(actor())

        async def one(state: tuple[asyncio.Queue, asyncio.Task]) -> float:
            mailbox = state[0]
            loop = asyncio.get_running_loop()

            def call(i: int) -> asyncio.Future[Any]:
                fut = loop.create_future()
                mailbox.put_nowait((i, fut))
                return fut

            return await bu.timed_loop_async(call, 2000, self.args.loop_s) * 1e6

        return self._rounds(setup, one)


def process_pingpong_us(n: int) -> float:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echoing child
        ours.close()
        while True:
            data = theirs.recv(64)
            if not data:
                os._exit(0)
            theirs.sendall(data)
    theirs.close()
    try:
        start = time.perf_counter()
        for _ in range(n):
            ours.sendall(b"x")
            ours.recv(64)
        return (time.perf_counter() - start) / n * 1e6
    finally:
        ours.close()
        os.waitpid(pid, 0)


def thread_pingpong_us(n: int) -> float:
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def echo() -> None:
        for _ in range(n):
            ping.acquire()
            pong.release()

    t = threading.Thread(target=echo)
    t.start()
    start = time.perf_counter()
    for _ in range(n):
        ping.release()
        pong.acquire()
    elapsed = time.perf_counter() - start
    t.join()
    return elapsed / n * 1e6


def loop_thread_pingpong_us(n: int) -> float:
    requests: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[int]] | None]
    requests = queue.SimpleQueue()

    def echo() -> None:
        while (request := requests.get()) is not None:
            loop, fut = request
            loop.call_soon_threadsafe(fut.set_result, 0)

    async def awaits() -> float:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        for _ in range(n):
            fut = loop.create_future()
            requests.put((loop, fut))
            await fut
        return (time.perf_counter() - start) / n * 1e6

    t = threading.Thread(target=echo)
    t.start()
    try:
        return asyncio.run(awaits())
    finally:
        requests.put(None)
        t.join()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-fd":
        serve(int(sys.argv[2]))
        return
    args = bu.parse_args()
    args.client_loop = args.client_loop or "uvloop"
    floor = Floor(args)
    workloads: dict[str, Callable[[], list[float]]] = {
        "rt_sync_us": floor.round_trip_us,
        "rt_await_us": floor.round_trip_us,
        "outstanding_calls_per_s": floor.outstanding_per_s,
        "gather_per_s": floor.gather_per_s,
        "gather_await_per_s": floor.gather_per_s,
        "inproc_rt_us": floor.inproc_rt_us,
        "inproc_rt_await_us": floor.inproc_rt_us,
        "process_pingpong_us": lambda: bu.sample_rounds(args, lambda: process_pingpong_us(3000)),
        "thread_pingpong_us": lambda: bu.sample_rounds(args, lambda: thread_pingpong_us(3000)),
        "loop_thread_pingpong_us": lambda: bu.sample_rounds(args, lambda: loop_thread_pingpong_us(3000)),
    }
    if not args.metrics:
        args.metrics = ",".join(workloads)
    rec = bu.Recorder("floor (uvloop + msgpack, no framework)", args, {})
    for key, measure in workloads.items():
        rec.run(key, measure)
    rec.finish()


if __name__ == "__main__":
    main()
