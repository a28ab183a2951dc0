"""Where actor failures go.

A failure nobody can receive as an exception (an exception in a ``broadcast`` endpoint, in
``__init__``, a ``BaseException``) must never vanish. Until the full supervision tree routes
it to the mesh's owner, it is reported on this process's stderr, which the spawner forwards to
the client's terminal.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monarch._src.actor.instance import ActorInstance


def report_actor_failure(instance: "ActorInstance", report: str) -> None:
    sys.stderr.write(f"monarch: actor failure: {report}\n")
    sys.stderr.flush()
