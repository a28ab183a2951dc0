"""A log directory another user could write to is never used.

The framework's log files go under ``/tmp/$USER/monarch-logs/``, a predictable name: another
user may create ``/tmp/$USER`` first (open to all, or as a symbolic link) and plant links in
it, so that our log lines land in a file of their choosing, or read them. The client checks
the directory with ``lstat`` and, when it is not this user's own and closed to writes by
others, keeps its logs in a fresh private directory instead.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fault_helpers import LOG_FILES_CLIENT as CLIENT
from helpers import run_python

NOBODY = 65534


@pytest.fixture
def user_dir() -> Iterator[Path]:
    """``/tmp/<a user name of this test alone>``, removed afterwards (whoever made it)."""
    path = Path("/tmp") / f"monarch-test-user-{uuid.uuid4().hex[:12]}"
    yield path
    if path.is_symlink():
        path.unlink()
    shutil.rmtree(path, ignore_errors=True)


def _owned_by_nobody_0777(base: Path, planted: Path) -> None:
    base.mkdir()
    (base / "monarch-logs").symlink_to(planted)  # their link, in their directory
    os.chown(base / "monarch-logs", NOBODY, NOBODY, follow_symlinks=False)
    os.chown(base, NOBODY, NOBODY)
    base.chmod(0o777)


def _ours_0777(base: Path, planted: Path) -> None:
    base.mkdir()
    base.chmod(0o777)
    (base / "monarch-logs").symlink_to(planted)


def _symlink(base: Path, planted: Path) -> None:
    base.symlink_to(planted)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "prepare", [_owned_by_nobody_0777, _ours_0777, _symlink], ids=lambda f: f.__name__[1:]
)
def test_logs_go_to_a_private_directory_instead(
    tmp_path: Path, user_dir: Path, prepare: Callable[[Path, Path], None]
) -> None:
    planted = tmp_path / "planted"  # where the other user wants our log lines
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    planted.chmod(0o777)
    prepare(user_dir, planted)
    before = os.lstat(user_dir)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    user = user_dir.name
    proc = run_python(CLIENT, LOGNAME=user, USER=user, TMPDIR=str(private_tmp))
    assert proc.returncode == 0, proc.stderr
    worker_log, client_log = proc.stdout.split()
    assert list(planted.iterdir()) == []  # nothing written where the other user pointed
    for log in (worker_log, client_log):
        assert "record" in Path(log).read_text()
        parent = os.lstat(Path(log).parent.parent)  # <base>/job-...: the base must be private
        assert parent.st_uid == os.geteuid() and not parent.st_mode & 0o022, (log, oct(parent.st_mode))
        assert not os.path.realpath(log).startswith(os.path.realpath(user_dir) + os.sep), log
    assert str(user_dir) in proc.stderr and "HINT: remove" in proc.stderr, proc.stderr
    after = os.lstat(user_dir)
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)  # not ours to change
    shutil.rmtree(Path(client_log).parent.parent)
