"""Helpers shared by test modules (importable as ``helpers``: pytest puts ``tests/`` on the path
for its conftest)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

T = TypeVar("T")

TESTS = Path(__file__).resolve().parent
#: First line of a client script run with ``python -c``: puts this folder's modules (``actors``)
#: on the import path of the script and of its workers (they get the client's import path).
IMPORT_TEST_MODULES = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"


def wait_until(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy, and return that; fail the test at the
    deadline. For conditions observable only from outside (files, /proc), not for runtime
    events, which tests wait for through futures."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped: a signal sent to another process (or to one's
    own from a thread other than the main one) takes hold only once the kernel schedules it, and a
    test that goes on meanwhile races the process it believes frozen."""
    os.kill(pid, signal.SIGSTOP)
    wait_until(
        lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T",
        timeout=5,
        what=f"process {pid} to stop",
    )


def _cuda_usable() -> bool:
    """Whether the driver lists a GPU and torch can use it (torch imported only where there is one)."""
    from monarch._src.launch.cli import cuda_device_count

    if cuda_device_count() == 0:
        return False
    import torch

    return bool(torch.cuda.is_available())


#: The GPU tests' mark: they run on a machine with an NVIDIA GPU, and elsewhere say why not.
requires_cuda = pytest.mark.skipif(
    not _cuda_usable(),
    reason="needs an NVIDIA GPU that torch can use (none here: the driver lists no GPU, or torch "
    "is a CPU build); these tests run on the GPU machine",
)


def all_processes(attrs: list[str] | None = None) -> Iterator[psutil.Process]:
    """Every running process, each a fresh ``psutil.Process``. ``psutil.process_iter`` caches
    them by pid: once pids wrap around (a long suite on a machine with a small ``pid_max``), a
    cached one stands for a new process with its old start time, and its ``environ()`` raises
    NoSuchProcess, so a leak check would miss the new process once and find it later."""
    psutil.process_iter.cache_clear()
    return psutil.process_iter(attrs)


def alive(procs: Iterable[psutil.Process | int]) -> list[psutil.Process]:
    """Those of ``procs`` (processes or pids) still running; a zombie counts as gone: only its
    reaping is left."""
    out = []
    for p in procs:
        try:
            proc = p if isinstance(p, psutil.Process) else psutil.Process(p)
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            pass
    return out


def running(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still running."""
    return [p.pid for p in alive(pids)]


def wait_while(find: Callable[[], list[T]], timeout: float = 10.0) -> list[T]:
    """Poll ``find`` (the processes still up) until it finds nothing or ``timeout`` passes; return
    its last answer. The one poller behind every "these processes must end" check: the leak
    checks of both conftests and ``wait_gone``."""
    deadline = time.monotonic() + timeout
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` runs; returns those still running at the deadline."""
    return wait_while(lambda: running(pids), timeout)


async def record_loop_gaps(gaps: list[float]) -> None:
    """Tick every 10 ms until cancelled, appending the time since the last tick to ``gaps``: a
    long gap shows that something blocked the running event loop."""
    import asyncio

    last = time.monotonic()
    while True:
        await asyncio.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last)
        last = now


REPO = Path(__file__).resolve().parents[1]


def run_python(code: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a client of its own) from the repository root, with
    ``env`` added to this environment; its output is captured as text."""
    return _run([sys.executable, "-c", code], timeout, env)


def run_python_with_private_shm(
    code: str, shm_size: str = "64m", timeout: float = 90, **env: str
) -> subprocess.CompletedProcess[str]:
    """``run_python`` in a private mount namespace with a fresh tmpfs of ``shm_size`` on
    ``/dev/shm``: the whole job (workers too) sees only its own files there, and other
    processes of the machine never see them. Skips the test where that needs what is missing
    (the ``unshare`` command, or the right to mount)."""
    if shutil.which("unshare") is None:
        pytest.skip("a private /dev/shm needs the unshare command, which is missing")
    unshare = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
    probe = subprocess.run(
        [*unshare, "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace with its own /dev/shm here: {probe.stderr.strip()}")
    shell = f'mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && exec {sys.executable} -c "$0"'
    return _run([*unshare, shell, code], timeout, env)


def _run(argv: list[str], timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=dict(os.environ, **env),
    )


def end_client(proc: subprocess.Popen[str], pids: list[int]) -> None:
    """Test teardown after a client ``proc`` was to be killed: kill it if it still runs, kill
    whatever of ``pids`` (its processes) is left, close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    for pid in running(pids):
        with contextlib.suppress(ProcessLookupError):  # it may exit between the check and the kill
            os.kill(pid, signal.SIGKILL)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def kill_leftovers(procs: list[psutil.Process]) -> None:
    """SIGKILL what a leak check found, so one leaking test does not fail the next ones too."""
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@contextlib.contextmanager
def runtime_loop_held() -> Iterator[None]:
    """Keep the runtime's loop thread busy (it reads nothing meanwhile) until the block ends: what
    still completes inside was read by another thread."""
    from monarch._src.actor.process_state import runtime

    rt = runtime()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(30)

    rt.loop_thread.call_soon(hold)
    assert held.wait(10)
    try:
        yield
    finally:
        release.set()


def drop_reply_connection(lent: Any, what: str) -> None:
    """Abort the one connection to the reply address ``lent`` (a ``loop_replies.ReplyAddress``)
    and wait for its replacement: the peer reconnects at once, and its hello (told apart from
    that of its connection to the process's own address) says whether a reply was lost."""
    conns = [c for c in lent._readers if c.peer]
    assert len(conns) == 1
    conns[0].abort(ConnectionResetError("dropped by the test"))
    wait_until(
        lambda: [c for c in lent._readers if c is not conns[0] and c.peer],
        timeout=10,
        what=f"the worker's new connection to {what}",
    )
