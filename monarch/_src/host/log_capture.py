"""Reading the stdout and stderr of the workers this process spawned.

Every worker writes to two pipes whose read ends the spawner watches on its event loop
(``add_reader``, non-blocking reads of up to 64 KiB). The spawner always drains them, so a
worker never blocks on a full pipe because nobody looks at its output. What it read goes:

* by default, to the spawner's own stdout/stderr, unprefixed, through the bounded writer
  threads of ``output_writer`` (the loop never writes to a terminal itself). When a writer is
  full, whole lines are dropped and counted; a notice such as
  ``[monarch: 123 lines from anon0 rank 2 dropped]`` takes their place once there is room;
* while the worker's mesh streams to the client (``ProcMesh.logging_option``), to the
  client, as ``LOG`` frames of complete lines sent over the runtime's own connections.

Control lines written by the worker (see ``monarch._src.actor.log_forwarding``) are
recognized and stripped here: they switch the mode at their exact position in the stream, or
mark a flush point. Both answer the requester on its reply port once they were read on stdout
and on stderr.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from monarch._src.actor.future import add_done_callback
from monarch._src.actor.log_forwarding import CONTROL_MARK, ask_workers, flush_aggregators
from monarch._src.actor.port import Port
from monarch._src.actor.process_state import runtime
from monarch._src.runtime import output_writer
from monarch._src.runtime.output_writer import stream_writer
from monarch._src.wire import protocol
from monarch._src.wire.protocol import (
    LOG_OPTIONS,
    OPT_DEST,
    OPT_MESH,
    OPT_PREFIX,
    OPT_STREAM,
    RANK,
    REPLY_PORT,
)

logger = logging.getLogger("monarch.host.logs")

READ_SIZE = 1 << 16
#: Reads per readiness callback, so one chatty worker cannot starve the loop.
READS_PER_WAKEUP = 8
#: A partial line (no newline yet) is shown after this long in the default mode.
PARTIAL_LINE_DELAY_S = 0.05
#: A partial line longer than this is passed on as a line of its own.
MAX_PARTIAL = 1 << 16
#: Pipe capacity asked of the kernel (Linux), to absorb bursts while the loop is busy.
PIPE_SIZE = 1 << 20
#: How long the notebook flush barrier waits for every worker's markers.
FLUSH_BARRIER_TIMEOUT_S = 2.0

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

_live: weakref.WeakSet[OutputCapture] = weakref.WeakSet()
_live_lock = threading.Lock()


def make_pipe() -> tuple[int, int]:
    """A pipe for one worker stream: (read end, non-blocking, for us; write end for the child)."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        fcntl.fcntl(r, _F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # above /proc/sys/fs/pipe-max-size for unprivileged users: keep the default
    return r, w


def _hold_control_start(buf: bytes) -> tuple[bytes, bytes]:
    """Split ``buf`` into what can be shown and a tail that may begin a control line."""
    i = buf.rfind(CONTROL_MARK[:1])
    if i >= 0 and len(buf) - i <= MAX_PARTIAL:
        tail = buf[i:]
        if tail.startswith(CONTROL_MARK) or CONTROL_MARK.startswith(tail):
            return buf[:i], tail
    return buf, b""


class _Pipe:
    __slots__ = (
        "fd",
        "stream",
        "partial",
        "partial_since",
        "dest",
        "mid",
        "prefix",
        "dropped",
        "closed",
        "timer",
    )

    def __init__(self, fd: int, stream: int) -> None:
        self.fd = fd
        self.stream = stream
        self.partial = b""
        #: When the line now in ``partial`` began (loop time).
        self.partial_since = 0.0
        self.dest: str | None = None
        self.mid: int | None = None
        self.prefix = ""
        self.dropped = 0
        self.closed = False
        self.timer: Any = None


class OutputCapture:
    """The two output pipes of one worker, read on the spawner's loop."""

    def __init__(self, label: str, stdout_fd: int, stderr_fd: int, forward_to: str | None = None) -> None:
        self.label = label
        #: Where output goes when its mesh does not stream (``logging_option``): the address of
        #: a process to send it to (a host agent's client), or None for this process's own
        #: stdout/stderr.
        self._forward_to = forward_to
        self._pipes = (_Pipe(stdout_fd, 1), _Pipe(stderr_fd, 2))
        for pipe in self._pipes:
            pipe.dest = forward_to
        self._controls: dict[tuple, set[int]] = {}
        self._rt = runtime()
        self.finished = threading.Event()
        with _live_lock:
            _live.add(self)

    # -- loop thread -----------------------------------------------------------------------------

    def start(self) -> None:
        loop = self._rt.loop
        for pipe in self._pipes:
            loop.add_reader(pipe.fd, self._readable, pipe)

    def _readable(self, pipe: _Pipe, limit: int = READS_PER_WAKEUP) -> None:
        for _ in range(limit):
            if pipe.closed:
                return
            try:
                data = os.read(pipe.fd, READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._eof(pipe)
                return
            self._feed(pipe, data)
            if len(data) < READ_SIZE:
                return

    def drain_now(self) -> None:
        """Read whatever the pipes hold right now (the worker has exited)."""
        for pipe in self._pipes:
            self._readable(pipe, limit=256)

    def _feed(self, pipe: _Pipe, data: bytes) -> None:
        had_partial = bool(pipe.partial)
        buf = pipe.partial + data if had_partial else data
        if CONTROL_MARK in buf:
            buf = self._controls_in(pipe, buf)
        nl = buf.rfind(b"\n")
        if nl >= 0 or not had_partial:
            pipe.partial_since = self._rt.loop.time()  # a new line begins
        if nl >= 0:
            if nl == len(buf) - 1:
                self._deliver(pipe, buf)
                buf = b""
            else:
                self._deliver(pipe, buf[: nl + 1])
                buf = buf[nl + 1 :]
        if len(buf) > MAX_PARTIAL:  # a very long line: pass on what it has so far
            shown, buf = _hold_control_start(buf)
            if shown:
                self._deliver(pipe, shown + b"\n" if pipe.dest is not None else shown)
        pipe.partial = buf
        if buf and pipe.dest is None and pipe.timer is None:
            pipe.timer = self._rt.loop.call_later(PARTIAL_LINE_DELAY_S, self._show_partial, pipe)

    def _show_partial(self, pipe: _Pipe) -> None:
        """Default mode: show a line still missing its newline (a prompt, a progress bar)."""
        pipe.timer = None
        buf = pipe.partial
        if not buf or pipe.dest is not None or pipe.closed:
            return
        wait = pipe.partial_since + PARTIAL_LINE_DELAY_S - self._rt.loop.time()
        if wait > 0:  # that partial line was completed; a newer one is pending
            pipe.timer = self._rt.loop.call_later(wait, self._show_partial, pipe)
            return
        shown, pipe.partial = _hold_control_start(buf)
        if shown:
            self._deliver(pipe, shown)

    def _controls_in(self, pipe: _Pipe, buf: bytes) -> bytes:
        """Handle and strip the complete control lines in ``buf``; return the rest."""
        while True:
            i = buf.find(CONTROL_MARK)
            if i < 0:
                return buf
            j = buf.find(b"\n", i)
            if j < 0:
                return buf  # the rest of the control line is still in the pipe
            before = buf[:i]
            nl = before.rfind(b"\n")
            if nl >= 0:
                self._deliver(pipe, before[: nl + 1])
            # A partial line written just before the control line continues after it.
            leftover = before[nl + 1 :]
            ctl = buf[i + len(CONTROL_MARK) : j]
            buf = leftover + buf[j + 1 :]
            try:
                self._control(pipe, json.loads(ctl))
            except Exception:
                logger.exception("bad control line from %s", self.label)

    def _control(self, pipe: _Pipe, obj: dict) -> None:
        op = obj.get("op")
        if op == "opt":
            options = obj.get(LOG_OPTIONS) or {}
            if options.get(OPT_STREAM):
                pipe.dest, pipe.mid = options.get(OPT_DEST), options.get(OPT_MESH)
                pipe.prefix = options.get(OPT_PREFIX) or ""
            else:
                pipe.dest, pipe.mid, pipe.prefix = self._forward_to, None, ""
            if pipe.timer is None and pipe.partial and pipe.dest is None:
                pipe.timer = self._rt.loop.call_later(PARTIAL_LINE_DELAY_S, self._show_partial, pipe)
        token = (op, tuple(obj.get(REPLY_PORT) or ()), obj.get(RANK))
        seen = self._controls.setdefault(token, set())
        seen.add(pipe.stream)
        self._complete_controls()

    def _complete_controls(self) -> None:
        needed = {p.stream for p in self._pipes if not p.closed}
        for token, seen in list(self._controls.items()):
            if needed <= seen:
                del self._controls[token]
                _, spec, rank = token
                if len(spec) == 2:
                    try:
                        ack: Port[None] = Port(spec[0], spec[1], rank)  # the control is answered, no value
                        ack.send(None)
                    except Exception:
                        logger.debug("could not answer %s", token, exc_info=True)

    def _deliver(self, pipe: _Pipe, data: bytes, last: bool = False) -> None:
        if pipe.dest is not None:
            header = protocol.log_lines(pipe.mid, pipe.stream, self.label, pipe.prefix, last)
            try:
                self._rt.send(pipe.dest, header, [data])
                return
            except Exception:  # the client is gone: show it here instead
                pipe.dest = None
        writer = stream_writer(pipe.stream)
        if pipe.dropped and writer.write(self._drop_notice(pipe), force=last):
            pipe.dropped = 0
        if data and not writer.write(data.decode("utf-8", "replace")):
            pipe.dropped += data.count(b"\n") or 1
        if last and pipe.dropped:  # the stream ended: say what it lost, even over the bound
            writer.write(self._drop_notice(pipe), force=True)
            pipe.dropped = 0

    def _drop_notice(self, pipe: _Pipe) -> str:
        return f"[monarch: {pipe.dropped} lines from {self.label} dropped]\n"

    def _eof(self, pipe: _Pipe) -> None:
        if pipe.closed:
            return
        rest = pipe.partial
        pipe.partial = b""
        if rest and pipe.dest is not None:
            rest += b"\n"
        self._deliver(pipe, rest, last=True)
        pipe.closed = True
        if pipe.timer is not None:
            pipe.timer.cancel()
            pipe.timer = None
        try:
            self._rt.loop.remove_reader(pipe.fd)
        except Exception:
            pass
        try:
            os.close(pipe.fd)
        except OSError:
            pass
        self._complete_controls()
        if all(p.closed for p in self._pipes):
            self.finished.set()


def after_output_written(callback: Callable[[], None], timeout: float = 1.0) -> None:
    """Call ``callback`` on the loop once this process's writers have written what they
    hold now (at most ``timeout`` seconds later, so a blocked terminal delays nothing long)."""
    rt = runtime()
    state: dict[str, Any] = {"left": 2, "done": False, "timer": None}
    lock = threading.Lock()

    def fire() -> None:  # on the loop
        with lock:
            if state["done"]:
                return
            state["done"] = True
        if state["timer"] is not None:
            state["timer"].cancel()  # lets go of the callback (and what it holds) at once
        callback()

    def arm_timeout() -> None:  # on the loop
        if not state["done"]:
            state["timer"] = rt.loop.call_later(timeout, fire)

    def one_written() -> None:
        with lock:
            state["left"] -= 1
            last = state["left"] == 0
        if last:
            rt.loop.call_soon_threadsafe(fire)

    for name in ("stdout", "stderr"):
        output_writer.writer(name).call_after(one_written)
    rt.loop_thread.call_soon(arm_timeout)


def _live_captures() -> list[OutputCapture]:
    with _live_lock:
        return list(_live)


def flush_at_exit(timeout: float = 2.0) -> None:
    """Client shutdown: read what the pipes still hold, then write every buffer out."""
    rt = runtime()
    captures = [c for c in _live_captures() if not c.finished.is_set()]
    if captures and not rt.closed and not rt.on_loop_thread():

        async def drain() -> None:
            for c in captures:
                c.drain_now()

        try:
            rt.loop_thread.run_sync(drain(), timeout=timeout)
        except Exception:
            pass
    flush_aggregators()
    output_writer.flush_all(timeout)


def flush_barrier(addresses: list[str], timeout: float = FLUSH_BARRIER_TIMEOUT_S) -> bool:
    """Make output the workers at ``addresses`` wrote so far visible here; bounded wait.

    Each worker flushes and writes a flush marker on stdout and stderr; once the spawner has
    read both markers of every worker (or ``timeout`` passed), buffered aggregation is written
    and the writer threads are drained.
    """
    ok = True
    if addresses:
        done = threading.Event()
        fut = ask_workers(addresses, protocol.log_flush)
        add_done_callback(fut, lambda _: done.set())
        ok = done.wait(timeout)
    flush_aggregators()
    return output_writer.flush_all(timeout) and ok


# -- notebooks -----------------------------------------------------------------------------------

_ipython_hook_registered = False


#: Each supplies addresses of live workers whose output reaches this process (the workers
#: this process spawned, those a host agent spawned for it).
worker_address_sources: list[Callable[[], list[str]]] = []


def live_worker_addresses() -> list[str]:
    """Every live worker whose output this process shows, for a flush barrier."""
    return [address for source in worker_address_sources for address in source()]


def _post_run_cell(*_: Any) -> None:
    try:
        flush_barrier(live_worker_addresses())
    except Exception:
        logger.debug("notebook flush failed", exc_info=True)


def maybe_register_ipython_hook() -> None:
    """In IPython/Jupyter, flush forwarded output at the end of every cell (registered once)."""
    global _ipython_hook_registered
    if _ipython_hook_registered:
        return
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return
    try:
        shell = ipython.get_ipython()
    except Exception:
        return
    if shell is None:
        return
    shell.events.register("post_run_cell", _post_run_cell)
    _ipython_hook_registered = True
