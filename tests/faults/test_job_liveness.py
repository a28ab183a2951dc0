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
import time
from pathlib import Path

import cloudpickle
import numpy as np
from helpers import wait_gone

from monarch._src.actor.proc import runtime
from monarch.actor import Actor, endpoint

cloudpickle.register_pickle_by_value(sys.modules[__name__])

REPO = Path(__file__).resolve().parents[2]
ELEMS = (4 << 20) // 8  # 4 MiB of float64: through shared memory
LONG_AGO = time.time() - 3600


class Doubler(Actor):
    @endpoint
    def double(self, x):
        return x * 2


def _start_client(tmpdir: Path) -> None:
    """A client with its own ``$TMPDIR`` starts (and sweeps), then exits."""
    proc = subprocess.run(
        [sys.executable, "-c", "from monarch._src.actor.proc import runtime; print(runtime().socket_dir)"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env=dict(os.environ, TMPDIR=str(tmpdir)),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(str(tmpdir)), proc.stdout


def test_live_job_keeps_working_while_a_client_with_another_tmpdir_starts(procs1, tmp_path):
    doubler = procs1.spawn("doubler", Doubler)
    for fill in range(3):  # pooled files on both sides, in use across calls
        assert float(doubler.double.call_one(np.full(ELEMS, fill)).get(timeout=30)[0]) == 2 * fill
    ours = glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*")
    assert ours
    for path in ours:  # a long-running job: its files are old
        os.utime(path, (LONG_AGO, LONG_AGO))
    _start_client(tmp_path)
    for fill in range(5):
        assert float(doubler.double.call_one(np.full(ELEMS, fill)).get(timeout=10)[0]) == 2 * fill
    assert set(ours) <= set(glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*"))


def test_files_of_another_user_are_never_touched(tmp_path):
    nobody = 65534
    names = [f"/dev/shm/monarch-job-otheruser{os.getpid()}-{i:016x}" for i in range(2)]
    names.append(f"/dev/shm/monarch-job-otheruser{os.getpid()}.lock")
    try:
        for path in names:
            with open(path, "wb") as f:
                f.write(b"x")
            os.chown(path, nobody, nobody)
            os.utime(path, (LONG_AGO, LONG_AGO))
        _start_client(tmp_path)
        assert [os.path.exists(p) for p in names] == [True] * len(names)
    finally:
        for path in names:
            Path(path).unlink(missing_ok=True)


DEAD_CLIENT = """
import json, os, threading
import numpy as np
from monarch.actor import Actor, endpoint, this_host
from monarch._src.actor.proc import runtime

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
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    shm_files = lambda: glob.glob(f"/dev/shm/monarch-{tag}[-.]*")  # noqa: E731
    assert shm_files()
    _start_client(next_tmp)  # another TMPDIR: only /dev/shm is shared
    assert shm_files() == []
    assert wait_gone([worker]) == []  # the worker follows its client
    # A client of the dead job's TMPDIR also removes its socket directory.
    _start_client(dead_tmp)
    assert not os.path.isdir(socket_dir)
