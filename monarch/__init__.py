"""monarch-aio: Monarch's actor programming model in pure, asyncio-native Python.

The actor API is in ``monarch.actor``; the torchrun-compatible launcher is ``python -m
monarch.launch``. The tensor engine's names (``fetch_shard``, ``remote``, ...) are here, loaded
on first use: importing this package imports nothing heavy (torch comes with the first of them).
"""

from typing import Any as _Any

__version__ = "0.1.0"

#: Public name -> the module of ``monarch._src`` that defines it, imported when first asked for.
_TENSOR_ENGINE = {
    "RemoteException": "monarch._src.tensor.worker",
    "Tensor": "monarch._src.tensor.tensor",
    "fetch_shard": "monarch._src.tensor.api",
    "get_active_mesh": "monarch._src.tensor.api",
    "inspect": "monarch._src.tensor.api",
    "no_mesh": "monarch._src.tensor.api",
    "reduce": "monarch._src.tensor.api",
    "reduce_": "monarch._src.tensor.api",
    "remote": "monarch._src.tensor.remote",
    "slice_mesh": "monarch._src.tensor.api",
    "to_mesh": "monarch._src.tensor.api",
}

__all__ = sorted(_TENSOR_ENGINE)


def __getattr__(name: str) -> _Any:
    module = _TENSOR_ENGINE.get(name)
    if module is None:
        raise AttributeError(f"module 'monarch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
