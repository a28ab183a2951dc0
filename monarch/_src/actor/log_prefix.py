"""Python ``logging`` inside an actor names the actor: ``[actor=<instance>] message``.

A record factory wrapping whatever factory was installed before adds the prefix to records
created while an actor runs (the ``current_instance`` context variable is set), unless
``monarch.actor.config.prefix_python_logs_with_actor`` is False. Empty messages are left alone.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from monarch._src.actor import config
from monarch._src.actor.context import current_instance

_lock = threading.Lock()
_installed = False


def prefixed(record: logging.LogRecord, actor: Any) -> None:
    msg = record.msg
    if msg is None or msg == "":
        return
    prefix = f"[actor={actor}] "
    if record.args:  # the message is a %-format string: keep the prefix literal
        prefix = prefix.replace("%", "%%")
    record.msg = prefix + (msg if isinstance(msg, str) else str(msg))


def install() -> None:
    """Install the prefixing record factory once per process."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if config.prefix_python_logs_with_actor:
                inst = current_instance.get()
                if inst is not None:
                    try:
                        prefixed(record, inst)
                    except Exception:  # never lose a record over its prefix
                        pass
            return record

        logging.setLogRecordFactory(factory)
