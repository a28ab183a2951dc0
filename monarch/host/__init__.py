"""The host agent: ``python -m monarch.host --help`` (see docs/hosts.md)."""

from monarch._src.host.agent import main as main

__all__ = ["main"]

# Pickles, reprs and tracebacks name the public path.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
