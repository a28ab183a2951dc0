"""The worker side of a launch: what runs inside each process of the ProcMesh.

The launcher spawns one :class:`Runner` actor per worker process and sends it a
:class:`WorkerSpec`. The runner hands the job to the process's *main thread* (the
worker's main thread idles in ``bootstrap`` waiting for exactly this), because user code
expects to own it: ``signal.signal`` only works there, and ``KeyboardInterrupt`` is
raised there. The job then

1. makes ``os.environ`` exactly the environment torchrun would have given the worker
   (the launcher's environment plus ``RANK``, ``WORLD_SIZE`` ...; the spawner's own
   ``MONARCH_*`` variables are removed);
2. points fd 1 and fd 2 at the log files (``-r``/``-t``), at ``/dev/null``
   (``--local-ranks-filter``) or leaves them alone;
3. runs the entry point like ``python -u script.py args`` would, as ``__main__``;
4. ends the process the way that interpreter would have ended: the exit code of
   ``SystemExit``, 1 after an uncaught exception (printed by ``sys.excepthook``, so
   torch's ``[rankN]:`` hook still applies), death by SIGINT after an uncaught
   ``KeyboardInterrupt``, non-daemon threads joined and ``atexit`` handlers run first.

In library mode (:mod:`.api`) the job calls a function instead and sends its return
value (or exception) back as the endpoint's reply; the process then stays up until the
launcher stops it.

The ``stacks`` endpoint runs on the runtime's event loop, not on the main thread, so it
answers while the training script is busy or stuck: it formats the Python stack of
every thread of the process (hang debugging, :mod:`.stacks`).
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import inspect
import os
import resource
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.endpoint import concurrent_endpoint, endpoint

from .command import EntryKind, WorkerCommand

__all__ = ["Runner", "WorkerExit", "WorkerSpec", "format_stacks", "signal_process_group"]

#: Signals a --no-python worker lets its child handle (it outlives them to report the
#: child's fate); the launcher sends these to the worker's process group.
_CHILD_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
#: Signals whose default action also writes a core file.
_CORE_SIGNALS = {"SIGQUIT", "SIGILL", "SIGABRT", "SIGFPE", "SIGSEGV", "SIGBUS", "SIGSYS", "SIGTRAP"}


class WorkerExit(Exception):
    """A function run by :func:`monarch.launch.run_spmd` called ``sys.exit`` with a failure code."""

    def __init__(self, code: Any) -> None:
        super().__init__(f"the function called sys.exit({code!r})")
        self.code = code

    def __reduce__(self) -> Any:
        return (WorkerExit, (self.code,))


@dataclass
class WorkerSpec:
    """Everything one worker needs to run its part of a launch.

    :param rank: global rank (for messages only; the environment carries it to user code).
    :param env: the complete environment of the user code.
    :param stdout: ``None`` to keep fd 1 (the spawner reads it), else a path to open
        for writing onto fd 1 (a log file, or ``/dev/null``).
    :param stderr: the same for fd 2.
    :param command: the entry point (script, module, run-path or executable), or ``None``
        in function mode.
    :param fn: function mode: the callable, with ``args``/``kwargs``.
    :param error_file: ``TORCHELASTIC_ERROR_FILE``; written for ``--run-path`` failures
        (torchrun records those without ``@record``).
    :param stats_file: where to write ``"<peak rss KiB>"`` when the worker ends (``--summary``).
    """

    rank: int
    env: dict[str, str]
    stdout: str | None = None
    stderr: str | None = None
    command: WorkerCommand | None = None
    fn: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    error_file: str = ""
    stats_file: str | None = None


class Runner(Actor):
    """One per worker process: runs the user code on the main thread; reports stacks."""

    @concurrent_endpoint
    async def run(self, spec: WorkerSpec) -> Any:
        """Start ``spec`` on the main thread.

        Script mode returns at once: the process's exit status is the result. Function
        mode returns the function's value, or raises its exception.
        """
        from monarch._src.runtime import bootstrap

        if spec.command is not None:
            bootstrap.run_on_main_thread(lambda: _script_job(spec))
            return None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any, error: BaseException | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(value)

        def job() -> None:
            value, error = _call_job(spec)
            loop.call_soon_threadsafe(settle, value, error)

        bootstrap.run_on_main_thread(job)
        return await done

    @endpoint
    async def stacks(self) -> str:
        """The Python stack of every thread of this process, main thread first."""
        return format_stacks()

    @endpoint
    async def signal_group(self, signum: int) -> None:
        """Send ``signum`` to this worker's process group, as the launcher does by pid on its
        own machine; for a worker on another machine (``--hosts``) this is how it is done."""
        signal_process_group(os.getpid(), signum)


def signal_process_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the worker's process group if it leads one, else to the worker."""
    if pid <= 0:  # never started (its template died first): never the launcher's own group
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- the main-thread jobs ------------------------------------------------------------------------


def _apply_env(target: dict[str, str]) -> None:
    for key in list(os.environ):
        if key not in target:
            del os.environ[key]
    for key, value in target.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _redirect(fd: int, path: str | None) -> None:
    if path is None:
        return
    stream = sys.stdout if fd == 1 else sys.stderr
    try:
        if stream is not None:
            stream.flush()
    except Exception:
        pass
    flags = os.O_WRONLY
    if path != os.devnull:
        flags |= os.O_CREAT | os.O_TRUNC
    target = os.open(path, flags, 0o644)
    try:
        os.dup2(target, fd)
    finally:
        os.close(target)


def _prepare(spec: WorkerSpec) -> None:
    _apply_env(spec.env)
    _redirect(1, spec.stdout)
    _redirect(2, spec.stderr)


def _script_job(spec: WorkerSpec) -> None:
    """Run the entry point, then end this process with the interpreter's exit status."""
    try:
        _prepare(spec)
        command = spec.command
        assert command is not None
        if command.kind is EntryKind.EXECUTABLE:
            code, sig = _run_executable(command)
        else:
            code, sig = _run_python(command, spec.error_file)
    except BaseException:  # noqa: B036 - a launcher bug must still end the worker visibly
        traceback.print_exc()
        code, sig = 1, None
    _exit_like_python(code, sig, spec.stats_file)


def _missing_entry_point(command: WorkerCommand) -> int | None:
    """What ``python script.py`` / ``python -m mod`` say when there is nothing to run."""
    if command.kind is EntryKind.MODULE:
        import importlib.util

        try:
            found = importlib.util.find_spec(command.target) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            sys.stderr.write(f"{sys.executable}: No module named {command.target}\n")
            return 1
        return None
    if not os.path.exists(command.target):
        sys.stderr.write(
            f"{sys.executable}: can't open file {os.path.abspath(command.target)!r}: "
            "[Errno 2] No such file or directory\n"
        )
        return 2
    return None


def _run_python(command: WorkerCommand, error_file: str) -> tuple[int, signal.Signals | None]:
    missing = _missing_entry_point(command)
    if missing is not None:
        return missing, None
    try:
        command.run()
    except SystemExit as e:
        return _system_exit_code(e), None
    except KeyboardInterrupt as e:
        _print_uncaught(e)
        return 130, signal.SIGINT
    except BaseException as e:  # noqa: B036 - exactly what the interpreter reports
        if command.kind is EntryKind.RUN_PATH and error_file:
            _record_error_file(e, error_file)
        _print_uncaught(e)
        return 1, None
    return 0, None


def _system_exit_code(e: SystemExit) -> int:
    """The exit status Python gives ``raise SystemExit(code)`` (printing a non-int code)."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
        sys.stderr.flush()
    except Exception:
        pass
    return 1


_INTERNAL_FILES = {
    os.path.normcase(os.path.abspath(__file__)),
    os.path.normcase(os.path.abspath(sys.modules[WorkerCommand.__module__].__file__ or "")),
}


def _is_internal(filename: str) -> bool:
    name = os.path.normcase(os.path.abspath(filename))
    if name in _INTERNAL_FILES:
        return True
    base = os.path.basename(name)
    return (
        base in ("runpy.py", "<frozen runpy>")
        or "runtime" + os.sep + "bootstrap.py" in name
        or filename.startswith("<frozen runpy")
    )


def _user_traceback(tb: Any) -> Any:
    """Drop the launcher's and runpy's frames from the front, as ``python script.py`` shows it."""
    while tb is not None and tb.tb_next is not None and _is_internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _print_uncaught(e: BaseException) -> None:
    tb = _user_traceback(e.__traceback__)
    try:
        sys.excepthook(type(e), e.with_traceback(tb), tb)
    except Exception:
        traceback.print_exception(type(e), e, tb)
    try:
        sys.stderr.flush()
    except Exception:
        pass


def _record_error_file(e: BaseException, path: str) -> None:
    """What torch's ``@record`` writes to ``TORCHELASTIC_ERROR_FILE`` (same JSON layout)."""
    import json
    import time

    tb = _user_traceback(e.__traceback__)
    data = {
        "message": {
            "message": f"{type(e).__name__}: {e}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(e), e, tb)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    try:
        with open(path, "w") as fp:
            json.dump(data, fp)
    except OSError:
        pass


def _run_executable(command: WorkerCommand) -> tuple[int, signal.Signals | None]:
    """``--no-python``: run the program as a child and take on its fate.

    The child shares this worker's process group, so the launcher's signals reach it;
    the worker itself ignores them (Python handlers, which ``exec`` resets for the
    child) so that it can report how the child ended. The child is killed if the
    worker dies (``PR_SET_PDEATHSIG``), so no program outlives its launcher.
    """
    import ctypes

    prctl: Any = None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        pass

    def set_death_signal() -> None:
        if prctl is not None:
            prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG

    for name in _CHILD_SIGNALS:
        signal.signal(getattr(signal, name), lambda *_: None)
    argv = command.subprocess_argv or (command.target,)
    try:
        proc = subprocess.Popen(list(argv), preexec_fn=set_death_signal)
    except OSError as e:
        sys.stderr.write(f"{command.target}: {e.strerror or e}\n")
        return (127 if isinstance(e, FileNotFoundError) else 126), None
    rc = proc.wait()
    if rc < 0:
        try:
            return 128 - rc, signal.Signals(-rc)
        except ValueError:
            return 128 - rc, None
    return rc, None


def _join_user_threads() -> None:
    """Wait for non-daemon threads, as interpreter shutdown does before ``atexit``."""
    me = threading.current_thread()
    while True:
        pending = [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
        if not pending:
            return
        for t in pending:
            t.join()


def _write_stats(path: str | None) -> None:
    if not path:
        return
    try:
        peak = max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        with open(path, "w") as fp:
            fp.write(str(peak))
    except OSError:
        pass


def _flush_std_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # a closed or broken stream must not stop the worker
            pass


def _exit_like_python(code: int, sig: signal.Signals | None, stats_file: str | None) -> None:
    """End the process as ``python -u script.py`` would have, after the script returned."""
    try:
        _join_user_threads()
        atexit._run_exitfuncs()
    except BaseException:  # noqa: B036 - nothing may keep the worker from exiting
        pass
    _write_stats(stats_file)
    _flush_std_streams()
    if sig is not None:
        if sig.name in _CORE_SIGNALS:
            try:
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            except (OSError, ValueError):
                pass
        try:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        except OSError:
            pass
        os._exit(code)
    # Interpreter shutdown still runs (modules are torn down, files flushed as their last
    # reference goes), but the collector skips everything alive now: Python does not
    # promise finalizers for objects that still exist at exit, and with torch imported
    # the final collections alone take about half a second.
    gc.freeze()
    from monarch._src.runtime import bootstrap

    bootstrap.request_exit(code)


def _call_job(spec: WorkerSpec) -> tuple[Any, BaseException | None]:
    """Function mode: call ``spec.fn`` on the main thread; (value, None) or (None, error)."""
    try:
        _prepare(spec)
        fn = spec.fn
        assert fn is not None
        result = fn(*spec.args, **spec.kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return result, None
    except SystemExit as e:
        if e.code is None or e.code == 0:
            return None, None
        return None, WorkerExit(e.code)
    except BaseException as e:  # noqa: B036 - returned to the caller as the endpoint's error
        tb = _user_traceback(e.__traceback__)
        return None, e.with_traceback(tb)
    finally:
        _flush_std_streams()


async def _await(aw: Any) -> Any:
    return await aw


# -- stacks -------------------------------------------------------------------------------------


def format_stacks() -> str:
    """Every thread's Python stack (user threads; monarch's own threads are counted only)."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    me = threading.get_ident()
    order = sorted(frames, key=lambda ident: (ident != main_ident, ident))
    out: list[str] = [f"pid {os.getpid()}"]
    hidden = 0
    for ident in order:
        if ident == me:
            continue
        thread = threads.get(ident)
        name = thread.name if thread is not None else f"Thread-{ident:#x}"
        if name.startswith("monarch-") or name.startswith("pt_"):
            hidden += 1
            continue
        stack = traceback.extract_stack(frames[ident])
        if ident == main_ident:
            name = "MainThread"
            # Drop bootstrap, this module and runpy from the top of the main thread's stack.
            first_user = next((i for i, f in enumerate(stack) if not _is_internal(f.filename)), None)
            if first_user is None:
                out.append("Thread MainThread: idle (no user code running)")
                continue
            stack = traceback.StackSummary.from_list(stack[first_user:])
        out.append(f"Thread {name} (most recent call last):")
        out.extend(line.rstrip("\n") for line in traceback.format_list(stack))
    if hidden:
        out.append(f"({hidden} monarch runtime thread{'s' if hidden != 1 else ''} not shown)")
    return "\n".join(out)
