"""Worker processes never outlive their client, however the client ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import end_client, running, wait_gone

REPO = Path(__file__).resolve().parents[1]

PRELUDE = textwrap.dedent(
    """
    import json, os, sys, threading
    from monarch.actor import Actor, endpoint, this_host

    class P(Actor):
        @endpoint
        def pids(self):
            return [os.getpid(), os.getppid()]

    pm = this_host().spawn_procs(per_host={"gpus": 2}, preload=PRELOAD)
    found = {p for ps in pm.spawn("p", P).pids.call().get(timeout=20).values() for p in ps}
    pids = sorted(found - {os.getpid()})  # the workers, and with PRELOAD their template
    print("PIDS " + json.dumps(pids), flush=True)
    """
)

ENDINGS = {
    "normal_exit": "",
    "uncaught_exception": "raise RuntimeError('client script failed')\n",
    "sys_exit_3": "sys.exit(3)\n",
}


def parse_pids(stdout: str) -> list[int]:
    for line in stdout.splitlines():
        if line.startswith("PIDS "):
            return json.loads(line[5:])
    raise AssertionError(f"no PIDS line in {stdout!r}")


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_workers_exit_with_the_client(ending):
    proc = subprocess.run(
        [sys.executable, "-c", "PRELOAD = ()\n" + PRELUDE + ENDINGS[ending]],
        capture_output=True,
        text=True,
        timeout=45,
        cwd=REPO,
    )
    pids = parse_pids(proc.stdout)
    assert len(pids) == 2 and os.getpid() not in pids
    expected_rc = {"normal_exit": 0, "uncaught_exception": 1, "sys_exit_3": 3}[ending]
    assert proc.returncode == expected_rc, proc.stderr
    if ending == "uncaught_exception":
        assert "client script failed" in proc.stderr
    assert wait_gone(pids) == []


@pytest.mark.parametrize("preload", [(), ("json",)], ids=["exec", "forked_from_template"])
def test_workers_exit_when_client_is_sigkilled(preload):
    code = f"PRELOAD = {preload!r}\n" + PRELUDE + "threading.Event().wait(60)\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )
    pids: list[int] = []
    try:
        line = proc.stdout.readline()  # blocks until the client printed its workers
        assert line.startswith("PIDS "), line + proc.stderr.read()
        pids = json.loads(line[5:])
        assert len(pids) == 2 + bool(preload)  # two workers (and their template)
        assert running(pids) == pids
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
        assert wait_gone(pids, timeout=5) == []
    finally:
        end_client(proc, pids)
