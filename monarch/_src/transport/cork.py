"""Which connections a thread has corked frames on (see ``outgoing``), so it can write them
before it blocks. Standard library only: blocking waits import it without the transport."""

from __future__ import annotations

import threading
from typing import Any


class _ThreadState(threading.local):
    #: The connections holding frames this thread corked (a class default: looking up an
    #: attribute a thread never set raises and catches an AttributeError, on every wait).
    corked: list[Any] | None = None


_this_thread = _ThreadState()


def note_corked(conn: Any) -> None:
    """``conn`` holds frames the calling thread sent in a burst and has not written yet."""
    corked = _this_thread.corked
    if corked is None:
        corked = _this_thread.corked = []
    if conn not in corked:
        corked.append(conn)


def flush_corked() -> None:
    """Write what the calling thread corked; call before blocking on a reply to it."""
    corked = _this_thread.corked
    if corked:
        _this_thread.corked = []
        for conn in corked:
            conn.write_corked()
