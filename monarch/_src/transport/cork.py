"""Which connections a thread has corked frames on (see ``outgoing``), so it can write them
before it blocks. Standard library only: blocking waits import it without the transport."""

from __future__ import annotations

import threading
from typing import Any

_this_thread = threading.local()


def note_corked(conn: Any) -> None:
    """``conn`` holds frames the calling thread sent in a burst and has not written yet."""
    corked = getattr(_this_thread, "corked", None)
    if corked is None:
        corked = _this_thread.corked = []
    if conn not in corked:
        corked.append(conn)


def flush_corked() -> None:
    """Write what the calling thread corked; call before blocking on a reply to it."""
    corked = getattr(_this_thread, "corked", None)
    if corked:
        _this_thread.corked = []
        for conn in corked:
            conn.write_corked()
