"""One job never removes another's files: liveness is the client's lock, not a file's age.

A client's start-up sweep removes what dead jobs of its user left: in ``/dev/shm`` whatever
their ``$TMPDIR``, and socket directories under its own. A job is dead when nobody holds its
lock (its client died, however); files of other users are never touched.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers import REPO, run_python, run_python_with_private_shm, wait_gone, wait_until

ELEMS = (4 << 20) // 8  # 4 MiB of float64: through shared memory


def _start_client(tmpdir: Path) -> None:
    """A client with its own ``$TMPDIR`` starts (and sweeps), then exits."""
    proc = run_python(
        "from monarch._src.actor.process_state import runtime; print(runtime().socket_dir)",
        TMPDIR=str(tmpdir),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(str(tmpdir)), proc.stdout


# The next two make a job's files look old, which the old sweep of any client on this machine
# would act on: they run in a private /dev/shm, out of every other process's sight.

LIVE_JOB = """
import glob, os, subprocess, sys, tempfile, time
import numpy as np
from monarch.actor import Actor, endpoint, this_host
from monarch._src.actor.process_state import runtime

class Doubler(Actor):
    @endpoint
    def double(self, x):
        return x * 2

pm = this_host().spawn_procs(per_host={"gpus": 1})
d = pm.spawn("d", Doubler)
for fill in range(3):  # pooled files on both sides, reused across calls
    d.double.call_one(np.full(ELEMS, float(fill))).get(timeout=30)
ours = glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*")
assert ours
for path in ours:  # a long-running job: its files are old
    os.utime(path, (time.time() - 3600,) * 2)
with tempfile.TemporaryDirectory() as other_tmp:  # a second client, another TMPDIR, starts
    code = "from monarch._src.actor.process_state import runtime; runtime()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30, env=dict(os.environ, TMPDIR=other_tmp))
for fill in range(5):
    print(float(d.double.call_one(np.full(ELEMS, float(fill))).get(timeout=10)[0]), flush=True)
print("KEPT", set(ours) <= set(glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*")))
pm.stop().get(timeout=10)
""".replace("ELEMS", str(ELEMS))


@pytest.mark.timeout(120)
def test_live_job_keeps_working_while_a_client_with_another_tmpdir_starts():
    proc = run_python_with_private_shm(LIVE_JOB)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0.0", "2.0", "4.0", "6.0", "8.0", "KEPT", "True"]


OTHER_USER = """
import os, time
from monarch._src.actor.process_state import runtime

names = [f"/dev/shm/monarch-job-otheruser-{i:016x}" for i in range(2)] + ["/dev/shm/monarch-job-otheruser.lock"]
for path in names:
    with open(path, "wb") as f:
        f.write(b"x")
    os.chown(path, 65534, 65534)  # nobody's
    os.utime(path, (time.time() - 3600,) * 2)
runtime()  # a client starts, and sweeps
print(*[os.path.exists(p) for p in names])
"""


def test_files_of_another_user_are_never_touched():
    proc = run_python_with_private_shm(OTHER_USER)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True"] * 3


DEAD_CLIENT = """
import json, os, threading
import numpy as np
from monarch.actor import Actor, endpoint, this_host
from monarch._src.actor.process_state import runtime

class Doubler(Actor):
    @endpoint
    def double(self, x):
        return x * 2

    @endpoint
    def pid(self):
        return os.getpid()

pm = this_host().spawn_procs(per_host={"gpus": 1})
d = pm.spawn("d", Doubler)
d.double.call_one(np.ones(1 << 20)).get(timeout=30)
print(json.dumps([runtime().socket_dir, runtime().job_tag, d.pid.call_one().get(timeout=30)]), flush=True)
threading.Event().wait(60)
"""


def test_files_of_a_killed_client_are_removed_by_the_next_client(tmp_path):
    dead_tmp, next_tmp = tmp_path / "dead", tmp_path / "next"
    dead_tmp.mkdir()
    next_tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", DEAD_CLIENT],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=dict(os.environ, TMPDIR=str(dead_tmp)),
    )
    try:
        line = proc.stdout.readline()
        socket_dir, tag, worker = json.loads(line)
        # The client is frozen first: it would notice its worker's death and clean up itself.
        # The worker is killed next: left alive, it would notice its client's death and, last
        # of the job, clean up itself (tests/test_orphans.py covers that). Here nobody is left.
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(
            lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, 10, "the client to stop"
        )
        os.kill(worker, signal.SIGKILL)
        assert wait_gone([worker]) == []
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    shm_files = lambda: glob.glob(f"/dev/shm/monarch-{tag}[-.]*")  # noqa: E731
    assert shm_files()
    _start_client(next_tmp)  # another TMPDIR: only /dev/shm is shared
    assert shm_files() == []
    # A client of the dead job's TMPDIR also removes its socket directory.
    _start_client(dead_tmp)
    assert not os.path.isdir(socket_dir)
