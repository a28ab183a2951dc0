"""A message whose shared-memory buffer vanished before the receiver mapped it fails its call.

The worker is stopped (SIGSTOP) while the call is sent, its /dev/shm file is removed (as a
hostile or mistaken sweep would), then the worker continues: the call fails with an error that
says what happened, and the worker keeps serving.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import glob, os, signal, sys
    sys.path[:0] = [os.path.join(sys.argv[1], "tests", "faults"), os.path.join(sys.argv[1], "tests")]
    import cloudpickle, fault_helpers
    from helpers import freeze
    cloudpickle.register_pickle_by_value(fault_helpers)
    from monarch._src.actor.process_state import runtime
    from monarch.actor import this_host

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        probe = pm.spawn("probe", fault_helpers.Probe)
        pid, _ = probe.where.call_one().get(timeout=30)
        freeze(pid)
        try:
            fut = probe.length.call_one(b"x" * (4 << 20))
            names = glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*")
            print("files", len(names), flush=True)
            for name in names:
                os.unlink(name)
        finally:
            os.kill(pid, signal.SIGCONT)
        try:
            fut.get(timeout=10)
            print("call: no error", flush=True)
        except Exception as err:
            print("call:", type(err).__name__, repr(str(err)), flush=True)
        print("after", probe.length.call_one(b"ok").get(timeout=10), flush=True)
    finally:
        pm.stop().get(timeout=10)
    """
)


@pytest.mark.timeout(60)
def test_vanished_shm_buffer_fails_the_call():
    env = dict(os.environ, MONARCH_SHM_POOL_BYTES="0")  # one file per message, none reused
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(REPO)],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}
    assert lines.get("files") == "files 1", proc.stdout
    call = lines["call:"]
    assert "shared-memory buffer" in call and "could not be mapped" in call and "HINT" in call, call
    assert lines.get("after") == "after 2"
