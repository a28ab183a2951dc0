"""Helpers for the launcher tests (imported by the tests and by conftest.py): run ``python -m monarch.launch`` or ``torchrun`` for real.

Every run is bounded (the whole process group is killed at its deadline) and every test
checks that no process started from its scripts directory survives it (torchrun's
workers are in their own sessions and are orphaned when torchrun dies; monarch workers
are covered by the suite-wide check in ``tests/conftest.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from helpers import alive, wait_until

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable))

#: Variables that change what a launcher does; removed so tests start from torchrun's defaults.
_KNOBS = (
    "OMP_NUM_THREADS",
    "LOGLEVEL",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
    "TORCHELASTIC_ERROR_FILE",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "PYTHON_EXEC",
)


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PET_") and not k.startswith("TORCHELASTIC_") and k not in _KNOBS
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


@dataclass
class Run:
    rc: int
    out: str
    err: str
    seconds: float

    def __repr__(self) -> str:
        return (
            f"Run(rc={self.rc}, {self.seconds:.2f} s)\n--- stdout ---\n{self.out}\n--- stderr ---\n{self.err}"
        )


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for p in [psutil.Process(proc.pid), *kids] if proc.poll() is None else kids:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def run_cmd(
    argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 60, cwd: str | Path | None = None
) -> Run:
    start = time.monotonic()
    proc = _popen(argv, env, cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        out, err = proc.communicate()
        raise AssertionError(f"{argv} did not finish within {timeout} s\n{out}\n{err}") from None
    return Run(proc.returncode, out, err, time.monotonic() - start)


def monarch_launch(*args: str, **kw: object) -> Run:
    return run_cmd([sys.executable, "-m", "monarch.launch", *args], **kw)  # type: ignore[arg-type]


def torchrun(*args: str, **kw: object) -> Run:
    if TORCHRUN is None:
        pytest.skip("torchrun is not installed")
    return run_cmd([TORCHRUN, *args], **kw)  # type: ignore[arg-type]


def start_launcher(
    *args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None
) -> subprocess.Popen[str]:
    return _popen([sys.executable, "-m", "monarch.launch", *args], env, cwd)


def _popen(argv: list[str], env: dict[str, str] | None, cwd: str | Path | None) -> subprocess.Popen[str]:
    """Start ``argv`` in its own session (so a test can kill its whole tree), output piped."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        start_new_session=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workers_of(pid: int) -> list[psutil.Process]:
    try:
        return [
            c
            for c in psutil.Process(pid).children(recursive=True)
            if "monarch._src.runtime.bootstrap" in " ".join(c.cmdline())
        ]
    except psutil.NoSuchProcess:
        return []


class Scripts:
    """Writes test scripts into a directory of their own (the leak check looks for it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, body: str) -> str:
        path = self.root / name
        path.write_text(textwrap.dedent(body).lstrip())
        return str(path)


def send_signal(proc: subprocess.Popen[str], sig: int) -> None:
    os.kill(proc.pid, sig)


__all__ = [
    "REPO",
    "Run",
    "Scripts",
    "alive",
    "clean_env",
    "free_port",
    "monarch_launch",
    "run_cmd",
    "send_signal",
    "signal",
    "start_launcher",
    "torchrun",
    "wait_until",
    "workers_of",
]
