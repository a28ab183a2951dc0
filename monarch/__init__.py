"""monarch-aio: Monarch's actor programming model in pure, asyncio-native Python.

The actor API is in ``monarch.actor``; the torchrun-compatible launcher is ``python -m
monarch.launch``. Importing this package imports nothing heavy.
"""

__version__ = "0.1.0"

# The API lives in the subpackages; ``from monarch import *`` must not import them.
__all__: list[str] = []
