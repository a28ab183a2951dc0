"""Hang debugging: print every rank's Python stacks on the launcher's console.

Triggered by ``SIGUSR1`` to the launcher, or by ``--hang-timeout`` seconds in which no
rank printed anything or exited. Each worker's :class:`~.worker.Runner` answers
``stacks()`` from the runtime's event loop thread, so it answers while the main thread
is busy in the training script or blocked in a collective. Lines are prefixed with the
global rank, ``[rank3]: ``, the way torch prefixes a rank's uncaught traceback.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from monarch._src.runtime import output_writer

__all__ = ["collect_stacks", "format_rank_stacks"]

#: How long the launcher waits for all ranks' answers in total.
STACKS_TIMEOUT_S = 5.0


def format_rank_stacks(rank: int, text: str) -> str:
    prefix = f"[rank{rank}]: "
    return "".join(prefix + line + "\n" for line in text.splitlines())


def collect_stacks(
    runner: Any,
    ranks: Sequence[int],
    alive: Sequence[bool],
    label: str = "gpus",
    timeout: float = STACKS_TIMEOUT_S,
) -> str:
    """Ask every live rank of ``runner`` (an ActorMesh of Runner) for its stacks."""
    futures: dict[int, Any] = {}
    for rank, live in zip(ranks, alive):
        if live:
            futures[rank] = runner.slice(**{label: rank}).stacks.call_one()
    deadline = time.monotonic() + timeout
    parts: list[str] = []
    for rank, live in zip(ranks, alive):
        if not live:
            parts.append(format_rank_stacks(rank, "(exited)"))
            continue
        try:
            text = futures[rank].get(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            text = f"(no answer within {timeout:g} s)"
        except Exception as e:  # the rank died while we asked
            text = f"(no answer: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        parts.append(format_rank_stacks(rank, text))
    return "".join(parts)


def print_stacks(text: str, reason: str) -> None:
    """Write the dump to the launcher's stderr, after the output already queued."""
    output_writer.flush_all(1.0)
    banner = (
        f"==================== monarch.launch: Python stacks of every rank ({reason}) ====================\n"
    )
    output_writer.writer("stderr").write(banner + text + "=" * (len(banner) - 1) + "\n", force=True)
    output_writer.flush_all(2.0)
