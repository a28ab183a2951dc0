"""A run leaves nothing in ``$TMPDIR``: not even the per-user ``monarch-<uid>`` directory the
job's socket directory lived in, unless another live job still uses it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_python

REPO = Path(__file__).resolve().parents[2]


def launch(tmpdir: Path, script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch.launch", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )


@pytest.mark.timeout(60)
def test_launch_leaves_tmpdir_empty(tmp_path, short_tmpdir):
    tmpdir = short_tmpdir
    script = tmp_path / "train.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'])\n")
    done = launch(tmpdir, script)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n"))[-2:] == ["rank 0", "rank 1"]
    assert os.listdir(tmpdir) == []


@pytest.mark.timeout(60)
def test_the_base_directory_stays_while_another_job_uses_it(tmp_path, short_tmpdir):
    tmpdir = short_tmpdir
    other_job = tmpdir / f"monarch-{os.getuid()}" / "job-other"
    other_job.mkdir(parents=True, mode=0o700)
    # A live job, as its client makes it: a socket in it, the directory's lock held.
    (other_job / f"{os.getpid()}-1.sock").touch()
    lock = os.open(other_job, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        script = tmp_path / "train.py"
        script.write_text("pass\n")
        done = launch(tmpdir, script)
        assert done.returncode == 0, done.stderr
        assert os.listdir(other_job.parent) == ["job-other"]
    finally:
        os.close(lock)


@pytest.mark.timeout(60)
def test_a_bad_setting_at_start_leaves_no_job_directory(short_tmpdir):
    # The runtime reads its settings after the job directory exists; a refused one must take
    # the directory (and the per-user base made for it) away again.
    client = "from monarch.actor import this_host\nthis_host().spawn_procs(per_host={'gpus': 1})\n"
    done = run_python(client, 50, TMPDIR=str(short_tmpdir), MONARCH_TRANSPORT="carrier-pigeon")
    assert done.returncode != 0
    assert "carrier-pigeon" in done.stderr
    assert os.listdir(short_tmpdir) == []
