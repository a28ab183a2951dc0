"""The client's ``unhandled_fault_hook``, each scenario in a child interpreter.

What the default hook does to a client (the report on stderr, the KeyboardInterrupt, exit code 1,
atexit handlers) and what a replaced or raising hook changes can only be observed from outside
the process, so every test here runs a script and checks its output and exit status. The
in-process supervision tree (owners, ``__supervise__``, failing pending calls) is in
test_supervision_tree.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import IMPORT_TEST_MODULES

DESCENDANTS = "and all its descendants have failed"


SCRIPT_HEADER = (
    IMPORT_TEST_MODULES
    + """
import atexit, os, sys, time
import monarch.actor
from monarch.actor import Actor, endpoint, this_host

class Boom(Actor):
    @endpoint
    def boom(self, msg):
        raise RuntimeError(msg)

    @endpoint
    def slow(self):
        time.sleep(30)
        return "slow done"

atexit.register(lambda: print("ATEXIT-RAN", flush=True))
"""
)


def run_script(body: str, timeout: float = 40.0) -> subprocess.CompletedProcess[str]:
    code = SCRIPT_HEADER + textwrap.dedent(body)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env
    )


def fail_unhandled_then_wait(mesh: str, message: str) -> str:
    """Script lines that fail the one actor of ``mesh`` with nobody to handle it, then give the
    hook 20 s to end the client before printing ``STILL-RUNNING``."""
    return f"""
pm = this_host().spawn_procs(per_host={{"gpus": 1}})
pm.spawn({mesh!r}, Boom).boom.broadcast({message!r})
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    time.sleep(0.05)
print("STILL-RUNNING", flush=True)
"""


def test_default_hook_ends_client_with_code_1_and_runs_atexit() -> None:
    proc = run_script(fail_unhandled_then_wait("doomed_mesh", "nobody handles this"))
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 1, (out, err)  # an uncaught Ctrl-C would die by SIGINT instead
    assert "STILL-RUNNING" not in out
    assert "ATEXIT-RAN" in out
    assert "Unhandled monarch error on the root actor, hostname=" in err and "PID=" in err, err
    assert "doomed_mesh" in err and "nobody handles this" in err and DESCENDANTS in err
    assert "UnhandledFaultInterrupt: unhandled monarch failure of mesh doomed_mesh" in err, err
    assert "catch KeyboardInterrupt to shut down gracefully" in err


def test_default_hook_interrupts_a_client_blocked_in_get() -> None:
    proc = run_script(
        """
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        healthy = pm.slice(gpus=0).spawn("healthy", Boom)
        doomed = pm.slice(gpus=1).spawn("doomed", Boom)
        fut = healthy.slow.call_one()
        doomed.boom.broadcast("fails while the client waits")
        print(fut.get(timeout=25), flush=True)
        """
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "slow done" not in proc.stdout and "ATEXIT-RAN" in proc.stdout
    assert "fails while the client waits" in proc.stderr


#: Counts the unhandled-failure reports the client writes to stderr, passing everything through.
COUNT_REPORTS = """
class CountReports:
    def __init__(self, inner):
        self.inner, self.reports = inner, 0
    def write(self, text):
        self.reports += text.count("Unhandled monarch error on the root actor")
        return self.inner.write(text)
    def __getattr__(self, name):
        return getattr(self.inner, name)

sys.stderr = CountReports(sys.stderr)
"""


@pytest.mark.slow
def test_default_hook_interrupt_is_a_keyboard_interrupt_the_script_can_catch() -> None:
    """The guide: the default hook "exits the process with a KeyboardInterrupt"; a script
    catches it to shut down gracefully, and the second failure of the same incident does not
    cut that cleanup short (only the first unhandled failure interrupts)."""
    proc = run_script(
        COUNT_REPORTS
        + """
pm = this_host().spawn_procs(per_host={"gpus": 3})
healthy = pm.slice(gpus=0).spawn("healthy", Boom)
doomed = pm.slice(gpus=slice(1, 3)).spawn("doomed", Boom)
fut = healthy.slow.call_one()
doomed.boom.broadcast("nobody handles this")
try:
    print(fut.get(timeout=25), flush=True)
except KeyboardInterrupt as e:
    print("CAUGHT", type(e).__name__, flush=True)
    deadline = time.monotonic() + 15
    while sys.stderr.reports < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("REPORTS", sys.stderr.reports, flush=True)
    pm.stop().get(timeout=15)
    print("CLEANUP-DONE", flush=True)
"""
    )
    out, err = proc.stdout, proc.stderr
    assert "CAUGHT UnhandledFaultInterrupt" in out, (out, err)
    assert "slow done" not in out
    assert "REPORTS 2" in out and "CLEANUP-DONE" in out, (out, err)
    assert "ATEXIT-RAN" in out
    # Catching the interrupt handled the failure: the script's own ending decides the status.
    assert proc.returncode == 0, (out, err)
    assert err.count("Unhandled monarch error on the root actor") == 2 and "nobody handles this" in err


def test_replaced_hook_called_once_per_fault_and_client_continues() -> None:
    proc = run_script(
        """
        import json, threading
        calls = []
        def hook(failure):
            calls.append([failure.mesh_name, failure.crashed_ranks])
        monarch.actor.unhandled_fault_hook = hook
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        m = pm.spawn("two_ranks", Boom)
        m.boom.broadcast("handled by the hook")
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        pm.stop().get(timeout=10)
        print("CALLS", json.dumps(sorted(calls)), flush=True)
        """
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert 'CALLS [["two_ranks", [0]], ["two_ranks", [1]]]' in proc.stdout
    assert "Unhandled monarch error" not in proc.stderr


def test_raising_hook_is_called_once_then_client_exits_1() -> None:
    proc = run_script(
        textwrap.dedent(
            """
            calls = []
            def hook(failure):
                calls.append(failure.mesh_name)
                raise RuntimeError("hook refuses")
            monarch.actor.unhandled_fault_hook = hook
            atexit.register(lambda: print("HOOK-CALLS", calls, flush=True))
            """
        )
        + fail_unhandled_then_wait("raising_hook_mesh", "the hook raises")
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "HOOK-CALLS ['raising_hook_mesh']" in proc.stdout
    assert "STILL-RUNNING" not in proc.stdout and "ATEXIT-RAN" in proc.stdout
    assert "Unhandled monarch error on the root actor" in proc.stderr and "the hook raises" in proc.stderr
