"""A socket base directory another user could write to is never used.

``$TMPDIR/monarch-<uid>`` has a predictable name: another user may create it first (or a
symbolic link by that name) and then remove or replace our sockets in it. The client checks it
with ``lstat`` and, when it is not a private directory of its own, uses a fresh private one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import run_python

NOBODY = 65534

CLIENT = """
from monarch.actor import Actor, endpoint, this_host
from monarch._src.actor.process_state import runtime

class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

pm = this_host().spawn_procs(per_host={"gpus": 1})
print(pm.spawn("echo", Echo).echo.call_one("works").get(timeout=30))
print(runtime().socket_dir)
pm.stop().get(timeout=10)
"""


def _owned_by_nobody_0777(base: Path) -> None:
    base.mkdir()
    os.chown(base, NOBODY, NOBODY)
    base.chmod(0o777)


def _ours_0777(base: Path) -> None:
    base.mkdir()
    base.chmod(0o777)


def _symlink(base: Path) -> None:
    elsewhere = base.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    base.symlink_to(elsewhere)


@pytest.mark.parametrize(
    "prepare", [_owned_by_nobody_0777, _ours_0777, _symlink], ids=lambda f: f.__name__[1:]
)
def test_client_uses_a_private_directory_instead(tmp_path: Path, prepare: Callable[[Path], None]) -> None:
    base = tmp_path / f"monarch-{os.getuid()}"
    prepare(base)
    before = os.lstat(base)
    proc = run_python(CLIENT, TMPDIR=str(tmp_path), MONARCH_STDERR_LOG="WARN")
    assert proc.returncode == 0, proc.stderr
    answer, socket_dir = proc.stdout.split()
    assert answer == "works"
    assert not os.path.realpath(socket_dir).startswith(os.path.realpath(base) + os.sep), socket_dir
    assert str(base) in proc.stderr and "HINT: remove" in proc.stderr, proc.stderr
    after = os.lstat(base)
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)  # not ours to change
    assert not os.path.exists(socket_dir)  # and the private one is gone with the client
