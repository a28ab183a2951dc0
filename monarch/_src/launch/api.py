"""The library form of the launcher: torchrun's job from Python code or a notebook.

:func:`spmd_launcher` takes torchrun's options as keyword arguments (the same names as
the flags, ``nproc_per_node=4``, ``max_restarts=2``, ``tee="3"``, ``log_dir=...``; ``nproc``
is short for ``nproc_per_node``) plus ``env=`` (extra variables for the workers), checks
them exactly like the command line, and returns an :class:`SPMDLauncher`. Its
:meth:`~SPMDLauncher.run` starts a function or a script on every rank and returns a
monarch :class:`~monarch.actor.Future`: ``.get()`` blocks, ``await`` works in async code and
notebooks. The result is a :class:`~monarch.actor.ValueMesh` over ``{"gpus": nproc}``:

* for a function, each rank's return value (the function is pickled by value when it
  lives in ``__main__`` or a notebook, and runs on the worker's main thread with
  torchrun's environment, so ``init_process_group()`` works with its defaults; a
  coroutine function is run with ``asyncio.run``);
* for a script (``run("train.py", "--lr", "0.1")``, or a module with ``module=True``),
  each rank's exit code (all 0), exactly as ``python -m monarch.launch`` would run it.

Failures are exceptions: :class:`~.summary.ChildFailedError` (torchrun's summary as its
message; for a function, the rank's own exception is its ``__cause__``), after
``max_restarts`` restarts of the whole group.

:func:`run_spmd` is the one-call form: ``run_spmd(fn, args=(cfg,), nproc_per_node=2)``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from monarch._src.actor.future import Future, pending_future, set_exception, set_result

from .agent import Agent, Outcome, Target
from .cli import parse_args
from .command import build_worker_command
from .config import LaunchConfig
from .logs import launcher_logger
from .summary import ChildFailedError

__all__ = ["SPMDLauncher", "run_spmd", "spmd_launcher"]

_FUNCTION_PLACEHOLDER = "<function>"
_ALIASES = {"nproc": "nproc_per_node", "redirect": "redirects"}


def _flags(options: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, value in options.items():
        key = _ALIASES.get(key, key)
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple, set, frozenset)):
            argv.append(f"{flag}={','.join(str(v) for v in value)}")
        else:
            argv.append(f"{flag}={value}")
    return argv


def _parse(argv: list[str]) -> LaunchConfig:
    """The command line's parse; a syntax error is a ValueError here, not an exit."""
    import contextlib
    import io

    buffer = io.StringIO()
    try:
        with contextlib.redirect_stderr(buffer):
            return parse_args(argv)
    except SystemExit:
        message = buffer.getvalue().strip().splitlines()
        raise ValueError(f"invalid launcher option: {message[-1] if message else argv}") from None


class SPMDLauncher:
    """torchrun's options, checked once; :meth:`run` launches with them (any number of times).

    :param env: variables added to (or replacing) the workers' inherited environment.
    :param options: torchrun's flags as keywords (``nproc_per_node=2``, ``max_restarts=1``,
        ``standalone=True``, ``kill_grace_period=5`` ...).
    :raises ValueError: a flag that does not exist or a value of the wrong type (the
        command line's exit code 2), or a value torchrun rejects (``nnodes="2:1"``,
        ``tee="5"`` ...: :class:`~.config.LaunchConfigError`, a ValueError).
    """

    def __init__(self, env: Mapping[str, str] | None = None, **options: Any) -> None:
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.options = dict(options)
        self._argv = _flags(options)
        self.config: LaunchConfig = _parse([*self._argv, _FUNCTION_PLACEHOLDER])

    def __repr__(self) -> str:
        return f"SPMDLauncher({' '.join(self._argv)})"

    def run(
        self, target: Callable[..., Any] | str | os.PathLike[str], *args: Any, **kwargs: Any
    ) -> Future[Any]:
        """Run ``target`` on every rank; a Future of the ValueMesh of per-rank results.

        ``target`` is a function (called with ``*args, **kwargs``) or a script path / module
        name (``*args`` are its command-line arguments; no keyword arguments).
        """
        if callable(target):
            config = self.config
            name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
            spec = Target(fn=target, args=tuple(args), kwargs=dict(kwargs), name=name)
        else:
            if kwargs:
                raise TypeError("a script takes command-line arguments only (positional strings)")
            config = _parse([*self._argv, os.fspath(target), *(str(a) for a in args)])
            command = build_worker_command(config)
            spec = Target(command=command, name=command.summary_name)
        env = dict(os.environ)
        env.update(self.env)
        agent = Agent(config, spec, launcher_env=env, log=launcher_logger())
        result: Future[Any] = pending_future()

        def drive() -> None:
            try:
                outcome = agent.run()
            except BaseException as e:  # noqa: B036 - delivered to whoever waits
                set_exception(result, e)
                return
            _settle(result, outcome)

        threading.Thread(target=drive, name="monarch-launch-agent", daemon=True).start()
        return result


def _settle(result: Future[Any], outcome: Outcome) -> None:
    if outcome.state == "succeeded":
        set_result(result, outcome.value_mesh())
        return
    if outcome.state == "failed" and outcome.error is not None:
        error: BaseException = outcome.error
        if outcome.cause is not None:
            error.__cause__ = outcome.cause
        set_exception(result, error)
        return
    set_exception(result, RuntimeError(f"the launch was stopped by signal {outcome.signum}"))


def spmd_launcher(env: Mapping[str, str] | None = None, **options: Any) -> SPMDLauncher:
    """An :class:`SPMDLauncher` with torchrun's options given as keywords."""
    return SPMDLauncher(env=env, **options)


def run_spmd(
    target: Callable[..., Any] | str | os.PathLike[str],
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> Future[Any]:
    """Run ``target(*args, **kwargs)`` (or the script ``target`` with ``args``) on every rank.

    ``options`` are torchrun's flags as keywords (``nproc_per_node=2``, ``max_restarts=1`` ...).
    Returns a Future of the ValueMesh of results; failures raise :class:`ChildFailedError`.
    """
    launcher = SPMDLauncher(env=env, **options)
    return launcher.run(target, *args, **dict(kwargs or {}))


# Keep the failure type reachable from here too.
ChildFailedError = ChildFailedError
