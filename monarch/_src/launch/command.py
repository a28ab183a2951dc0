"""What a worker runs, described as data.

torchrun turns its options into a command line (``python -u script.py args``,
``python -u -m module args``, ``./binary args``) or, for ``--run-path``, into a
function run in a multiprocessing child. Our workers are long-lived Monarch
processes that run Python entry points *in their own main thread* instead of
exec'ing a new interpreter, so the runtime needs to know *what* to run rather
than a command line. :class:`WorkerCommand` carries that, plus the derived
facts that must still match torchrun (the command line it would have used,
the name in the failure summary, ``sys.argv`` and ``sys.path[0]``).
"""

from __future__ import annotations

import enum
import os
import runpy
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from .config import LaunchConfig, LaunchConfigError

__all__ = ["EntryKind", "WorkerCommand", "build_worker_command"]


class EntryKind(enum.Enum):
    """How the training entry point is started."""

    SCRIPT = "script"
    """``python -u script.py args``: run a file as ``__main__``."""
    MODULE = "module"
    """``python -u -m pkg.mod args`` (``-m``): run a module as ``__main__``."""
    EXECUTABLE = "executable"
    """``script args`` (``--no-python``): exec a program; cannot run in-process."""
    RUN_PATH = "run_path"
    """``--run-path``: ``runpy.run_path(script)`` in a child, no ``-u``, no sys.path change."""


@dataclass(frozen=True)
class WorkerCommand:
    """One worker's entry point.

    :param kind: see :class:`EntryKind`.
    :param target: script path, module name or executable, as the user typed it.
    :param args: the training script's arguments, verbatim.
    :param python: the interpreter torchrun would use (``$PYTHON_EXEC`` or the
        launcher's ``sys.executable``); it matters for the command line and for
        the failure-summary name.
    :param start_method: ``--start-method``, meaningful for :attr:`EntryKind.RUN_PATH`.
    """

    kind: EntryKind
    target: str
    args: tuple[str, ...]
    python: str
    start_method: str = "spawn"

    @property
    def runs_in_process(self) -> bool:
        """Whether a Python worker can run it in its own main thread."""
        return self.kind is not EntryKind.EXECUTABLE

    @property
    def unbuffered(self) -> bool:
        """torchrun passes ``-u`` to script and module workers, not to ``--run-path``
        ones (a multiprocessing child) nor to executables."""
        return self.kind in (EntryKind.SCRIPT, EntryKind.MODULE)

    @property
    def argv(self) -> tuple[str, ...]:
        """``sys.argv`` the user code starts with.

        For :attr:`EntryKind.MODULE`, Python replaces ``argv[0]`` with the
        module's file path once it has found it, as ``python -m`` does; the
        first element here is the module name until then.
        """
        return (self.target, *self.args)

    @property
    def subprocess_argv(self) -> tuple[str, ...] | None:
        """The command line torchrun would ``Popen``; ``None`` for ``--run-path``,
        which torchrun runs as a function in a multiprocessing child."""
        if self.kind is EntryKind.SCRIPT:
            return (self.python, "-u", self.target, *self.args)
        if self.kind is EntryKind.MODULE:
            return (self.python, "-u", "-m", self.target, *self.args)
        if self.kind is EntryKind.EXECUTABLE:
            return (self.target, *self.args)
        return None

    @property
    def binary(self) -> str:
        """What torchrun's ``failed (exitcode: N) ... of binary: X`` line names
        (for ``--run-path`` it logs ``of fn: run_script_path``)."""
        if self.kind is EntryKind.EXECUTABLE:
            return self.target
        if self.kind is EntryKind.RUN_PATH:
            return "run_script_path"
        return self.python

    @property
    def summary_name(self) -> str:
        """The ``<name>`` of torchrun's ``<name> FAILED`` summary title.

        torchrun takes the first argument not starting with ``-`` when the
        interpreter is its own ``sys.executable`` (so the script path as typed,
        or the module name), but the interpreter path itself when
        ``$PYTHON_EXEC`` points elsewhere; that quirk is kept.
        """
        if self.kind is EntryKind.RUN_PATH:
            return "run_script_path"
        if self.kind is EntryKind.EXECUTABLE:
            return self.target
        if self.python != sys.executable:
            return self.python
        cmd = self.subprocess_argv or ()
        return next((arg for arg in cmd[1:] if arg[:1] != "-"), "")

    def sys_path0(self, cwd: str | None = None) -> str | None:
        """The ``sys.path[0]`` Python would set up, or ``None`` to leave it alone.

        ``python script.py`` puts the script's real directory (symlinks
        resolved) first; ``python -m`` puts the working directory.
        ``runpy.run_path`` does not touch ``sys.path`` for a plain file.

        :param cwd: the worker's working directory (a relative script path is
            resolved against it); ``None`` = this process's.
        """
        base = os.getcwd() if cwd is None else cwd
        if self.kind is EntryKind.SCRIPT:
            return os.path.dirname(os.path.realpath(os.path.join(base, self.target)))
        if self.kind is EntryKind.MODULE:
            return base
        return None

    def run(self) -> None:
        """Run the entry point in this process, in the calling (main) thread.

        Sets ``sys.argv`` and ``sys.path[0]`` as the interpreter would, makes
        stdout/stderr write-through for the ``-u`` kinds, and executes the code
        as ``__main__``. It returns when the script returns and lets
        ``SystemExit`` and exceptions propagate, so the caller maps them to an
        exit code exactly as the interpreter would. It changes global
        interpreter state and is meant for a process dedicated to one worker.

        :raises LaunchConfigError: for :attr:`EntryKind.EXECUTABLE`, which has to be exec'd.
        """
        if self.kind is EntryKind.EXECUTABLE:
            raise LaunchConfigError(
                f"{self.target} is an executable (--no-python) and cannot run in-process",
                torchrun_error=None,
                hint="exec subprocess_argv instead",
            )
        path0 = self.sys_path0()
        if path0 is not None:
            if sys.path:
                sys.path[0] = path0
            else:
                sys.path.append(path0)
        if self.unbuffered:
            for stream in (sys.stdout, sys.stderr):
                reconfigure = getattr(stream, "reconfigure", None)
                if reconfigure is not None:
                    reconfigure(write_through=True)
        sys.argv = list(self.argv)
        if self.kind is EntryKind.MODULE:
            runpy.run_module(self.target, run_name="__main__", alter_sys=True)
        elif self.kind is EntryKind.SCRIPT:
            _run_script(self.target)
        else:
            runpy.run_path(self.target, run_name="__main__")


def _run_script(target: str) -> None:
    """Run a script file as ``python target`` does: in a new ``__main__``, ``__file__`` absolute.

    A script that changes directory can still find the files next to ``__file__``, as under
    torchrun. ``runpy.run_path`` is not used for plain files because it would also set
    ``sys.argv[0]`` to the path it is given, where Python keeps it as typed. Directories and
    zip files (which run their ``__main__.py``) still go through it.
    """
    import io
    import pkgutil
    import types

    path = os.path.abspath(target)
    if pkgutil.get_importer(path) is not None:
        runpy.run_path(target, run_name="__main__")
        return
    with io.open_code(path) as f:
        code = pkgutil.read_code(f)  # a compiled .pyc
    if code is None:
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def build_worker_command(
    config: LaunchConfig,
    *,
    environ: Mapping[str, str] | None = None,
    python: str | None = None,
) -> WorkerCommand:
    """Decide the worker entry point from ``-m``/``--no-python``/``--run-path``.

    Precedence is torchrun's: ``--run-path`` wins over everything, then
    ``--no-python``, then ``-m``; ``--no-python`` with ``-m`` (and no
    ``--run-path``) is an error.

    :param environ: where ``PYTHON_EXEC`` is read; ``None`` = ``os.environ``.
    :param python: override the interpreter (default ``$PYTHON_EXEC`` or ``sys.executable``).
    :raises LaunchConfigError: ``--no-python`` together with ``--module``.
    """
    env = os.environ if environ is None else environ
    interpreter = python if python is not None else env.get("PYTHON_EXEC", sys.executable)
    args = tuple(config.training_script_args)
    if config.run_path:
        kind = EntryKind.RUN_PATH
    elif config.no_python:
        if config.module:
            raise LaunchConfigError(
                "Don't use both the '--no-python' flag and the '--module' flag at the same time."
            )
        kind = EntryKind.EXECUTABLE
    elif config.module:
        kind = EntryKind.MODULE
    else:
        kind = EntryKind.SCRIPT
    return WorkerCommand(
        kind=kind,
        target=config.training_script,
        args=args,
        python=interpreter,
        start_method=config.start_method,
    )
