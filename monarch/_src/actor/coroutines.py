"""Telling ``async def`` functions apart without importing ``inspect`` or ``asyncio``.

Both are slow to import, and ``import monarch.actor`` is meant to be fast.
"""

from __future__ import annotations

import functools
from typing import Any

_CO_COROUTINE = 0x80


def is_coroutine_function(fn: Any) -> bool:
    """Like ``inspect.iscoroutinefunction``: plain ``async def`` functions and methods."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    return code is not None and bool(code.co_flags & _CO_COROUTINE)


async def _probe() -> None:
    pass


_probe_coroutine = _probe()
#: The type of a coroutine object, for hot paths that test it inline.
COROUTINE_TYPE = type(_probe_coroutine)
_probe_coroutine.close()


def is_coroutine(value: Any) -> bool:
    """Whether ``value`` is a coroutine object (what calling an ``async def`` returns)."""
    return type(value) is COROUTINE_TYPE
