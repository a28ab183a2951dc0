"""Nothing of a job outlives its client's ``kill -9``: not its processes (even those whose
event loop is busy, or whose parent-alive pipe a fork of the client still holds), not its
socket directory, not its ``/dev/shm`` files; and no other client has to start to clean up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import end_client, running, wait_gone, wait_until

REPO = Path(__file__).resolve().parents[2]

CLIENT = textwrap.dedent(
    """
    import json, os, sys, threading
    from monarch.actor import Actor, endpoint, this_host
    from monarch._src.actor.process_state import runtime  # internal: where the job's files are

    SPIN_DIR, PRELOAD, FORK_HOLDER = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"

    class Holder(Actor):
        '''Keeps a large buffer the client lent it, and lends one back: /dev/shm files of
        both sides stay in use.'''
        @endpoint
        def hold(self, buf):
            self.buf = buf
            return os.getpid(), os.getppid(), bytes(4 << 20)

    class Spinner(Actor):
        @endpoint
        async def spin(self):
            open(os.path.join(SPIN_DIR, str(os.getpid())), "w").close()
            while True:  # never yields to the event loop
                pass

    pm = this_host().spawn_procs(per_host={"gpus": 2}, preload=PRELOAD)
    replies = pm.spawn("holder", Holder).hold.call(bytes(4 << 20)).get(timeout=30).values()
    kept = [r[2] for r in replies]  # the workers' lent buffers stay mapped here
    pids = sorted({p for r in replies for p in r[:2]} - {os.getpid()})  # workers (+ template)
    pm.spawn("spinner", Spinner).spin.broadcast()
    if FORK_HOLDER:  # a fork of the client keeps the write ends of the parent-alive pipes
        holder = os.fork()
        if holder == 0:
            threading.Event().wait(60)
            os._exit(0)
        pids_extra = {"holder": holder}
    else:
        pids_extra = {}
    rt = runtime()
    print("JOB " + json.dumps({"pids": pids, "dir": rt.socket_dir, "tag": rt.job_tag, **pids_extra}), flush=True)
    threading.Event().wait(60)
    """
)


def shm_files(tag: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"monarch-{tag}-")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fork_holder", [False, True], ids=["pipe", "pipe_held_by_a_fork"])
@pytest.mark.parametrize("preload", [[], ["json"]], ids=["exec", "forked_from_template"])
def test_sigkilled_client_leaves_nothing_behind_even_with_busy_workers(
    tmp_path, short_tmpdir, preload, fork_holder
):
    tmpdir, spin_dir = short_tmpdir, tmp_path / "spin"
    spin_dir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(spin_dir), json.dumps(preload), "1" if fork_holder else "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(tmpdir)},
    )
    pids: list[int] = []
    try:
        line = proc.stdout.readline()  # blocks until the client printed its job
        assert line.startswith("JOB "), line + proc.stderr.read()
        job = json.loads(line[4:])
        pids = job["pids"]
        if "holder" in job:
            pids.append(job["holder"])
        assert len(pids) == 2 + bool(preload) + fork_holder
        wait_until(lambda: len(os.listdir(spin_dir)) == 2, timeout=20, what="both workers spinning")
        assert os.path.isdir(job["dir"]) and shm_files(job["tag"])

        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        if fork_holder:
            job_pids = [p for p in pids if p != job["holder"]]
            assert wait_gone(job_pids, timeout=5) == []
            assert running([job["holder"]])  # the pipes' write ends really are still held
        else:
            assert wait_gone(pids, timeout=5) == []
        wait_until(lambda: not os.path.exists(job["dir"]), timeout=2, what="the job's socket directory gone")
        assert shm_files(job["tag"]) == []
        assert os.listdir(tmpdir) == []  # the per-user base directory too: no other job used it
    finally:
        end_client(proc, pids)
