"""Jobs: named host meshes from one call (``ProcessJob``, ``LocalJob``); see docs/hosts.md."""

from monarch._src.host.job import JobState as JobState
from monarch._src.host.job import JobTrait as JobTrait
from monarch._src.host.job import LocalJob as LocalJob
from monarch._src.host.job import ProcessJob as ProcessJob

__all__ = ["JobState", "JobTrait", "LocalJob", "ProcessJob"]

# Pickles, reprs and tracebacks name the public path.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
