"""Helpers of the multi-node launcher tests: several launchers (or torchruns) run side by side,
one per "node", each bounded, their outputs collected."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from launch_helpers import TORCHRUN, Run, _kill_tree, _popen, clean_env

#: Writes the worker's whole environment to <dir>/rank<RANK>.json.
DUMP_ENV = """
import json, os, sys
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as fp:
    json.dump(dict(os.environ), fp)
"""


def launcher(tool: str) -> list[str]:
    """The command line prefix of ``tool``: ``"monarch"`` or ``"torchrun"``."""
    if tool == "torchrun":
        assert TORCHRUN is not None
        return [TORCHRUN]
    return [sys.executable, "-m", "monarch.launch"]


def start_nodes(
    commands: Sequence[Sequence[str]], env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """Start one launcher per command (each in its own session, output piped)."""
    return [_popen(list(argv), env if env is not None else clean_env(), None) for argv in commands]


def finish(procs: Sequence[subprocess.Popen[str]], timeout: float) -> list[Run]:
    """Wait for every launcher (all within ``timeout`` seconds), killing the rest at the deadline."""
    start = time.monotonic()
    runs = []
    for proc in procs:
        left = max(0.1, timeout - (time.monotonic() - start))
        try:
            out, err = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            for p in procs:
                _kill_tree(p)
            out, err = proc.communicate()
            raise AssertionError(f"{proc.args} did not finish within {timeout} s\n{out}\n{err}") from None
        runs.append(Run(proc.returncode, out, err, time.monotonic() - start))
    return runs


def run_nodes(
    commands: Sequence[Sequence[str]], timeout: float = 60, env: dict[str, str] | None = None
) -> list[Run]:
    return finish(start_nodes(commands, env), timeout)


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port`` (a launcher hosting a store)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def read_envs(directory: Path, world_size: int) -> list[dict[str, str]]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(world_size)]
