"""Monarch's RDMA warning classes, and the one-time notice that bytes go the slow way."""

from __future__ import annotations

import os
import sys
import threading
import warnings


class RDMAReadTransferWarning(Warning):
    """Monarch's class; kept for code that filters it (monarch-aio never raises it)."""


class RDMAWriteTransferWarning(Warning):
    """Monarch's class; kept for code that filters it (monarch-aio never raises it)."""


class RDMATcpFallbackWarning(Warning):
    """Bytes of an RDMABuffer move as chunks served by the owner's runtime over the
    transport, not by a one-sided copy: once per process."""


warnings.simplefilter("once", RDMAReadTransferWarning)
warnings.simplefilter("once", RDMAWriteTransferWarning)
warnings.simplefilter("once", RDMATcpFallbackWarning)

_noticed = False
_lock = threading.Lock()


def notice_served_transfer(why: str) -> None:
    """Warn, the first time in this process, that a transfer is served in chunks, and why."""
    global _noticed
    with _lock:
        if _noticed:
            return
        _noticed = True
    warnings.warn(
        f"RDMABuffer bytes are moving in chunks served by the owner's runtime over the monarch "
        f"transport ({why}); no ibverbs device is used. Same-host transfers copy memory "
        "directly where the kernel allows it.\nHINT: set MONARCH_RDMA_ALLOW_TCP_FALLBACK=0 "
        "(monarch.configure(rdma_allow_tcp_fallback=False)) to fail instead.",
        RDMATcpFallbackWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the first caller outside this package (the user's transfer; a
    copy thread's own frame when the fallback is found there)."""
    here = os.path.dirname(__file__)
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and os.path.dirname(frame.f_code.co_filename) == here:
        frame, level = frame.f_back, level + 1
    return level
