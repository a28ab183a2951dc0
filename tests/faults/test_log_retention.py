"""Old jobs' log directories are removed by a new client, so they do not pile up for ever.

Each client makes ``/tmp/$USER/monarch-logs/job-<time>-<pid>``; a new one keeps the newest
``MONARCH_LOG_KEEP_JOBS`` and removes older ones whose client has exited, never a live job's
or anything not named like a job's directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_helpers import LOG_FILES_CLIENT as CLIENT
from helpers import run_python

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def user_dir() -> Iterator[Path]:
    """``/tmp/<a user name of this test alone>``, removed afterwards."""
    path = Path("/tmp") / f"monarch-test-user-{uuid.uuid4().hex[:12]}"
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _exited_pid() -> int:
    """A pid no process has now (that of a child that exited and was reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def _old_job(base: Path, stamp: str, pid: int, age_s: int) -> Path:
    job = base / f"job-{stamp}-{pid}"
    job.mkdir(parents=True)
    (job / "client.log").write_text("old\n")
    old = job.stat().st_mtime - age_s
    os.utime(job, (old, old))
    return job


def test_a_new_client_keeps_the_newest_jobs_and_every_live_one(user_dir: Path) -> None:
    base = user_dir / "monarch-logs"
    dead = _exited_pid()
    newest = _old_job(base, "20261201-000004", dead, age_s=100)
    older = [_old_job(base, f"20261201-00000{i}", dead, age_s=1000 + i) for i in range(3)]
    live = _old_job(base, "20261130-000000", os.getpid(), age_s=5000)  # this test: alive
    other = base / "notes"  # not a job's directory
    other.mkdir()
    proc = run_python(CLIENT, LOGNAME=user_dir.name, USER=user_dir.name, MONARCH_LOG_KEEP_JOBS="2")
    assert proc.returncode == 0, proc.stderr
    job = Path(proc.stdout.split()[0]).parent
    assert job.parent == base and job.exists()
    # kept: the newest old job (with the client's own, 2) and the live one beyond the count
    assert sorted(p.name for p in base.iterdir()) == sorted([job.name, newest.name, live.name, "notes"])
    assert not any(p.exists() for p in older)


def test_keep_zero_keeps_everything_and_a_bad_value_is_reported(user_dir: Path) -> None:
    base = user_dir / "monarch-logs"
    old = [_old_job(base, f"20261201-00000{i}", _exited_pid(), age_s=1000 + i) for i in range(3)]
    kept = run_python(CLIENT, LOGNAME=user_dir.name, USER=user_dir.name, MONARCH_LOG_KEEP_JOBS="0")
    assert kept.returncode == 0, kept.stderr
    assert all(p.exists() for p in old)
    bad = run_python(CLIENT, LOGNAME=user_dir.name, USER=user_dir.name, MONARCH_LOG_KEEP_JOBS="many")
    assert bad.returncode == 0, bad.stderr
    assert "MONARCH_LOG_KEEP_JOBS='many' is not a count" in bad.stderr, bad.stderr
    assert all(p.exists() for p in old)  # the default, 100, keeps them
