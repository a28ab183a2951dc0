"""Monarch's runtime settings: ``configure(**settings)``, ``configured(...)``, ``get_global_config()``.

Implementations live in ``monarch._src.runtime.config``; this facade re-exports them. Importing
it starts nothing (no runtime, no event loop).
"""

from monarch._src.runtime.config import clear_runtime_config as clear_runtime_config
from monarch._src.runtime.config import configure as configure
from monarch._src.runtime.config import configured as configured
from monarch._src.runtime.config import get_global_config as get_global_config
from monarch._src.runtime.config import get_runtime_config as get_runtime_config

__all__ = [
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
]
