"""A peer's new connection waits for its old one: per-sender FIFO across a reconnection.

When a peer's connection to this process drops at the peer's end, the peer reconnects at once
and sends first, on the new connection, the frames it never wholly wrote on the old one
(``transport.outgoing``). The old connection may still carry frames this process has not read
(in its socket buffer, or on the wire), which are older: the new connection's frames wait until
the old one delivered every frame the peer's hello says it wrote on it, or ended, or made no
progress for ``IDLE_S`` (it is then closed, and what it lost is settled as for any drop; an old
connection idle for that long after it delivered them is closed too).
Meanwhile the new connection is not read further (its transport paused, where it can be), so
what waits is about one read's worth.

Once the old connection delivered those frames, or ended, the peer is told how many it read
(``transport.read_count``), if it asked: it waits for that before it sends again the frames it
wrote there that were not read, ahead of its newer frames.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from monarch._src.transport.connection import IncomingConnection

#: An old connection that delivers no frame for this long, while a newer one waits on it, is
#: closed (its peer closed its end already: what has not come by then is taken as lost).
IDLE_S = 5.0

Handler = Callable[[dict, list], None]

logger = logging.getLogger("monarch.runtime")


class Behind:
    """Holds the frames of ``new`` until ``old`` delivered ``written`` frames (past its hello)
    or is closed (``release``); ``route_all(route, frames)`` then routes them, in order.

    The connections of a reply address are read by its holder's thread, or the runtime's loop
    (``loop_replies``): a frame of ``new`` may be read on one thread while ``release`` runs on
    another. Under ``_lock``, such a frame is held until the last held ones were taken, then
    routed as it comes: after them, never into a list nobody routes any more."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        new: IncomingConnection,
        old: IncomingConnection,
        written: int,
        route: Handler,
        route_all: Callable[[IncomingConnection, Handler, list[tuple[dict, list]]], None],
        unrouted: Callable[[], int],
    ) -> None:
        """``route_all(conn, route, frames)``: routes the frames held of ``conn`` (``new``, or
        the one that took its place, ``hand_over``); ``unrouted()``: how many frames ``old``
        read (counted in ``frames_read``) are not routed yet (read by an idle thread and on
        their way to the loop, ``idle_reads``)."""
        self._loop = loop
        self._unrouted = unrouted
        self._new, self._old, self._written = new, old, written
        self._route, self._route_all = route, route_all
        self._frames: list[tuple[dict, list]] = []
        #: ``release`` began (once), and the held frames were routed (from then on, frames of
        #: ``new`` are routed as they come).
        self._releasing = self._released = False
        #: Held while a frame of ``new`` is held, and while ``release`` takes those held.
        self._lock = threading.Lock()
        self._old_route = old.on_frame
        old.on_frame = self._old_frame
        self._paused = self._hold_frames_of(new)
        self._seen = old.frames_read
        self._timer = loop.call_later(IDLE_S, self._check)
        logger.debug(
            "%s: the new connection waits for %d more frames on the old one",
            old.peer,
            written + 1 - self._seen,
        )
        if self._delivered():  # read meanwhile by another thread (a reply address's holder)
            self.release()

    def _hold_frames_of(self, new: IncomingConnection) -> bool:
        """Hold ``new``'s frames from now on; whether its reading was paused."""
        new.on_frame = self._hold
        try:
            new.transport.pause_reading()  # type: ignore[union-attr]
            return True
        except NotImplementedError:  # a loop's reply connection (``SocketReader``): frames queue
            return False

    def hand_over(self, replaced: IncomingConnection, new: IncomingConnection, route: Handler) -> bool:
        """``replaced``, the connection that waits here, was replaced before it was told what
        was read (its peer asks again on ``new``): ``new`` waits here in its place, its frames
        after those held, and is told instead. False, and nothing done, if ``replaced`` does not
        wait here, or once released or ``old`` closed (``replaced`` was told then, or the count
        is in its drop, see ``Runtime._settle``)."""
        with self._lock:
            if self._releasing or self._old.closed or self._new is not replaced:
                return False
            self._new, self._route = new, route
            self._paused = self._hold_frames_of(new)
        logger.debug("%s: a newer connection waits for the old one in place of one it replaced", new.peer)
        return True

    def _hold(self, header: dict, bodies: list) -> None:
        with self._lock:
            if not self._released:
                self._frames.append((header, bodies))
                return
        self._route(header, bodies)  # read while released: after the frames held, as they went

    def _old_frame(self, header: dict, bodies: list) -> None:
        self._old_route(header, bodies)
        if self._delivered():
            self.release()

    def _delivered(self) -> bool:
        """Whether ``old`` delivered the frames its peer wrote there."""
        return self._old.frames_read - self._unrouted() - 1 >= self._written  # its hello is not counted

    def _check(self) -> None:
        """Close ``old`` once it stays idle (also after ``release``: its peer closed it, and
        a half-open connection would be kept forever)."""
        if self._old.closed:
            return
        if self._old.frames_read == self._seen:
            self._old.abort(
                ConnectionResetError(f"no frame for {IDLE_S}s on a connection its peer replaced and closed")
            )
            return
        self._seen = self._old.frames_read
        self._timer = self._loop.call_later(IDLE_S, self._check)

    def release(self) -> None:
        """Route the frames held, in order, and read on (once; later calls do nothing)."""
        with self._lock:
            if self._releasing:
                return
            self._releasing = True
        self._new.tell_read(self._old.read_upto(self._written))  # unless told already (``old`` ended)
        self._old.on_frame = self._old_route
        logger.debug("%s: the new connection's %d waiting frames go on", self._old.peer, len(self._frames))
        while True:  # (routed without the lock, which a thread reading ``new`` may wait on)
            with self._lock:
                frames, self._frames = self._frames, []
                last = not frames
                if last:  # every frame held was routed: the next ones go as they come
                    self._released = True
                    self._new.on_frame = self._route
            self._route_all(self._new, self._route, frames)  # (last, with none: ``new`` is read on)
            if last:
                break
        if self._paused:
            self._new.transport.resume_reading()  # type: ignore[union-attr]
