"""Forwarding worker output to the client: the worker's and the client's halves.

Each worker's stdout and stderr are pipes read by the process that spawned it (the host
layer's ``log_capture``). Two things travel *inside* those pipes, as control lines that the
spawner's reader recognizes and strips: a worker answering ``logging_option`` writes the new
options on both streams, and a worker asked to flush writes a flush marker on both. Because a
control line sits at an exact position in the stream, everything before it is handled the old
way and everything after it the new way, and a flush marker proves that all output written
before it has been read.

Frames (kinds registered in ``proc._install``):

* ``LOG_OPTION`` client -> worker ``{p: reply port, r: rank, o: options}``: apply the level
  filter, write the options control line on stdout and stderr; the spawner replies on ``p``
  once it has read both.
* ``LOG_FLUSH`` client -> worker ``{p, r}``: flush, write a flush marker on both streams; the
  spawner replies once what preceded them has been delivered.
* ``LOG`` spawner -> client ``{m: mesh log id, s: 1|2, x: prefix, l: label, e: last?}`` with one
  body of complete lines: shown on the client's stdout/stderr, aggregated per window when the
  mesh asked for it.

The level filter is ``logging.disable(level - 1)`` in the worker while it streams: records
below ``level`` are not created at all (printing is never filtered).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from monarch._src.actor.future import Future, completed_future, pending_future, set_result
from monarch._src.actor.log_aggregator import Aggregator
from monarch._src.actor.port import Port, PortHandler
from monarch._src.actor.process_state import runtime
from monarch._src.runtime.output_writer import stream_writer
from monarch._src.wire.protocol import (
    END_OF_STREAM,
    LABEL,
    LOG_MESH,
    LOG_OPTIONS,
    OPT_LEVEL,
    OPT_STREAM,
    PREFIX,
    RANK,
    REPLY_PORT,
    STREAM,
)

logger = logging.getLogger("monarch.logging")

#: Starts a control line in a worker's output pipe (two ASCII separators, then a tag).
CONTROL_MARK = b"\x1e\x1fmonarch-control:"
#: Set by the spawner in the environment of a worker whose output it reads.
CAPTURE_ENV = "MONARCH_LOG_CAPTURE"

#: Read once and removed, so that processes this worker starts do not inherit it.
_captured = os.environ.pop(CAPTURE_ENV, None) == "1"


# -- the worker's half -------------------------------------------------------------------------


def output_is_captured() -> bool:
    """Whether a spawner reads this process's stdout/stderr (true in spawned workers)."""
    return _captured


def _reply(spec: list, rank: int | None) -> None:
    ack: Port[None] = Port(spec[0], spec[1], rank)  # an acknowledgement carries no value
    ack.send(None)


def _write_control(obj: dict) -> None:
    """Flush Python's buffers, then append one control line to fd 1 and fd 2."""
    line = CONTROL_MARK + json.dumps(obj, separators=(",", ":")).encode() + b"\n"
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        for s in {
            id(x): x for x in (stream, sys.__stdout__ if fd == 1 else sys.__stderr__) if x is not None
        }.values():
            try:
                s.flush()
            except Exception:
                pass
        view = memoryview(line)
        while view:
            try:
                n = os.write(fd, view)
            except InterruptedError:
                continue
            except OSError:
                break
            view = view[n:]


def apply_level(options: dict) -> None:
    level = int(options.get(OPT_LEVEL, logging.INFO))
    if options.get(OPT_STREAM) and level > 0:
        logging.disable(level - 1)
    else:
        logging.disable(logging.NOTSET)


def handle_log_option(header: dict, bodies: list) -> None:
    spec, rank, options = header[REPLY_PORT], header.get(RANK), header[LOG_OPTIONS]
    if not _captured:  # nobody reads this process's pipes (e.g. the client in its own mesh)
        _reply(spec, rank)
        return
    apply_level(options)
    _write_control({"op": "opt", REPLY_PORT: spec, RANK: rank, LOG_OPTIONS: options})


def handle_log_flush(header: dict, bodies: list) -> None:
    spec, rank = header[REPLY_PORT], header.get(RANK)
    if not _captured:
        _reply(spec, rank)
        return
    _write_control({"op": "flush", REPLY_PORT: spec, RANK: rank})


# -- the client's half ---------------------------------------------------------------------------


class _Acks(PortHandler):
    """Resolves once every asked worker answered, or is gone (a dead worker prints nothing)."""

    label = "logging"

    def __init__(self, count: int) -> None:
        self.future: Future[None] = pending_future()
        self._left = count
        self._lock = threading.Lock()
        self.open()

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        with self._lock:
            self._left -= 1
            done = self._left == 0
        if done:
            self._finish()

    def fail(self, exc: BaseException) -> None:
        self._finish()

    def _finish(self) -> None:
        self.close()
        self.stop_expecting()
        set_result(self.future, None)


def ask_workers(addresses: list[str], header_of: Callable[[list, int], dict]) -> Future[None]:
    """Send ``header_of(reply port, rank)`` to each address; resolves when all answered."""
    if not addresses:
        return completed_future(None)
    rt = runtime()
    acks = _Acks(len(addresses))
    acks.expect_from(addresses)
    spec = [rt.address, acks.port_id]
    for i, address in enumerate(addresses):
        rt.send(address, header_of(spec, i), [])
    return acks.future


class _MeshLog:
    """Forwarded output of one mesh, as the client shows it."""

    __slots__ = ("window", "agg", "armed", "generation")

    def __init__(self, window: float | None) -> None:
        self.window = window
        self.agg = Aggregator()
        self.armed = False
        self.generation = 0


_lock = threading.Lock()
_meshes: dict[int, _MeshLog] = {}
_mesh_ids: dict[tuple, int] = {}
#: (stream, label) -> lines this process could not write because its writer was full.
_dropped: dict[tuple[int, str], int] = {}


def mesh_log_id(addresses: tuple) -> int:
    with _lock:
        mid = _mesh_ids.get(addresses)
        if mid is None:
            mid = _mesh_ids[addresses] = len(_mesh_ids) + 1
        return mid


def prepare_client(mid: int, window: float | None) -> None:
    """Before the workers start streaming: somewhere for their first lines to go."""
    with _lock:
        if mid not in _meshes:
            _meshes[mid] = _MeshLog(window)


def set_client_options(mid: int, stream: bool, window: float | None) -> None:
    """Once every worker applied an option (so what they wrote before it has arrived):
    the client side of the mesh's forwarding follows; what the old window held is written
    when aggregation or streaming is turned off."""
    with _lock:
        state = _meshes.get(mid)
        if not stream:
            out = state.agg.drain() if state is not None else {}
            _meshes.pop(mid, None)
        elif state is None:
            _meshes[mid] = _MeshLog(window)
            out = {}
        else:
            out = state.agg.drain() if window is None else {}
            if window is None:
                state.generation += 1
                state.armed = False
            state.window = window
    _write_out(out)


def streaming_meshes() -> list[int]:
    with _lock:
        return list(_meshes)


def _write(stream: int, text: str, label: str) -> None:
    writer = stream_writer(stream)
    key = (stream, label)
    if _dropped:
        n = _dropped.get(key)
        if n and writer.write(f"[monarch: {n} lines from {label} dropped]\n"):
            with _lock:
                _dropped.pop(key, None)
    if not writer.write(text):
        with _lock:
            _dropped[key] = _dropped.get(key, 0) + text.count("\n")


def _write_out(out: dict[int, str]) -> None:
    for stream in sorted(out):
        _write(stream, out[stream], "aggregated output")


def handle_log(header: dict, bodies: list) -> None:
    """A batch of complete lines from one worker stream (on the loop thread)."""
    stream = 2 if header.get(STREAM) == 2 else 1
    prefix = header.get(PREFIX) or ""
    label = header.get(LABEL) or "a worker"
    text = bytes(bodies[0]).decode("utf-8", "replace") if bodies else ""
    state = _meshes.get(header.get(LOG_MESH))  # type: ignore[arg-type]
    if text:
        if state is None or state.window is None:
            if prefix:
                text = "".join(prefix + line for line in text.splitlines(keepends=True))
            _write(stream, text, label)
        else:
            with _lock:
                state.agg.add_text(stream, text, prefix)
                full = state.agg.full
                arm = not full and not state.armed
                if arm:
                    state.armed = True
                gen = state.generation
                window = state.window
            if full:
                _close_window(state, None)
            elif arm:
                _arm(state, gen, window)
    if header.get(END_OF_STREAM) and state is not None:
        _close_window(state, None)  # a worker's stream ended (it exited): show its last lines


def _arm(state: _MeshLog, generation: int, window: float) -> None:
    rt = runtime()

    def start() -> None:
        rt.loop.call_later(window, _close_window, state, generation)

    if rt.on_loop_thread():
        start()
    else:
        rt.loop.call_soon_threadsafe(start)


def _close_window(state: _MeshLog, generation: int | None) -> None:
    """End ``state``'s window (``generation`` None: unconditionally) and write its summary."""
    with _lock:
        if generation is not None and generation != state.generation:
            return  # a stale timer: that window was already closed early
        state.generation += 1
        state.armed = False
        out = state.agg.drain() if len(state.agg) else {}
    _write_out(out)


def flush_aggregators() -> None:
    """Write every buffered group now (flush barrier, shutdown)."""
    with _lock:
        states = list(_meshes.values())
    for state in states:
        _close_window(state, None)
