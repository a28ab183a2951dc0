"""``monarch.actor.config``: process-wide switches of the actor layer (Monarch's names).

``prefix_python_logs_with_actor``: Python ``logging`` records created inside an actor get the
prefix ``[actor=<the actor instance>] ``. Set it to False to turn that off; the value the
client has when it spawns processes is passed on to them (``MONARCH_PREFIX_PYTHON_LOGS_WITH_ACTOR``).
"""

from __future__ import annotations

import os

PREFIX_ENV = "MONARCH_PREFIX_PYTHON_LOGS_WITH_ACTOR"

prefix_python_logs_with_actor: bool = os.environ.get(PREFIX_ENV, "1").strip().lower() not in (
    "0",
    "false",
    "no",
    "off",
)
