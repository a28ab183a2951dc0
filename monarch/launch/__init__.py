"""``monarch.launch``: torchrun on process meshes, as a command and as a library.

Command line: ``python -m monarch.launch [torchrun flags] script.py args`` (see
``docs/launch.md``). Library: run a function or a script on N ranks from Python or a
notebook, with the same options, and get every rank's result back::

    from monarch.launch import run_spmd, spmd_launcher

    losses = run_spmd(train, args=(cfg,), nproc_per_node=2).get()   # or: await run_spmd(...)
    launcher = spmd_launcher(nproc_per_node=4, max_restarts=2)
    launcher.run("train.py", "--epochs", "3").get()
"""

from monarch._src.launch.api import SPMDLauncher as SPMDLauncher
from monarch._src.launch.api import run_spmd as run_spmd
from monarch._src.launch.api import spmd_launcher as spmd_launcher
from monarch._src.launch.summary import ChildFailedError as ChildFailedError
from monarch._src.launch.summary import ProcessFailure as ProcessFailure
from monarch._src.launch.worker import WorkerExit as WorkerExit

__all__ = ["ChildFailedError", "ProcessFailure", "SPMDLauncher", "WorkerExit", "run_spmd", "spmd_launcher"]
