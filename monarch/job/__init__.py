"""Jobs: named host meshes from one call (``ProcessJob``, ``LocalJob``, ``SlurmJob``); see
docs/hosts.md and docs/slurm.md."""

from monarch._src.host.job import JobState as JobState
from monarch._src.host.job import JobTrait as JobTrait
from monarch._src.host.job import LocalJob as LocalJob
from monarch._src.host.job import ProcessJob as ProcessJob
from monarch._src.host.slurm_job import SlurmJob as SlurmJob

__all__ = ["JobState", "JobTrait", "LocalJob", "ProcessJob", "SlurmJob"]

# Pickles, reprs and tracebacks name the public path.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
