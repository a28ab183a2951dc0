"""The runtime on the standard asyncio loop (uvloop is optional) and spawn-time bootstrap."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import wait_until

import monarch.actor
from monarch.actor import Actor, ActorError, SupervisionError, endpoint, this_host

SCRIPT = textwrap.dedent(
    """
    import os
    import numpy as np
    from monarch.actor import Actor, endpoint, this_host
    from monarch._src.actor.process_state import runtime

    class E(Actor):
        @endpoint
        def loop_module(self):
            return type(runtime().loop).__module__

        @endpoint
        def nbytes(self, x):
            return x.nbytes

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    e = procs.spawn("e", E)
    print("workers", sorted(set(e.loop_module.call().get().values())))
    print("client", type(runtime().loop).__module__)
    print("payload", e.nbytes.call(np.ones(1 << 18)).get().values())
    procs.stop().get()
    """
)


@pytest.mark.parametrize("loop, expected", [("asyncio", "asyncio.unix_events"), ("uvloop", "uvloop")])
def test_runtime_runs_on_either_event_loop(loop: str, expected: str) -> None:
    env = {**os.environ, "MONARCH_EVENT_LOOP": loop}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"workers ['{expected}']" in out.stdout
    assert f"client {expected}" in out.stdout
    assert "payload [2097152, 2097152]" in out.stdout


class ReadsEnv(Actor):
    @endpoint
    def booted(self) -> str | None:
        return os.environ.get("MONARCH_TEST_BOOTED")


def _set_env() -> None:
    os.environ["MONARCH_TEST_BOOTED"] = "yes"


def _fail() -> None:
    raise ValueError("bootstrap refused")


def test_bootstrap_runs_before_user_actors() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_set_env)
    try:
        actors = procs.spawn("reads_env", ReadsEnv)
        assert procs.initialized.get(timeout=30) is True
        assert actors.booted.call().get(timeout=30).values() == ["yes", "yes"]
    finally:
        procs.stop().get(timeout=10)


def test_failing_bootstrap_fails_initialized_with_the_cause() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_fail)
    try:
        with pytest.raises(ActorError, match="bootstrap refused"):
            procs.initialized.get(timeout=30)
    finally:
        procs.stop().get(timeout=10)


def test_actors_spawned_after_a_failing_bootstrap_fail_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whoever never looks at ``initialized`` still hears of it: the actors do not run on a
    # process whose bootstrap (its environment, its devices) failed.
    faults: list = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_fail)
    try:
        actors = procs.spawn("reads_env", ReadsEnv)
        with pytest.raises(
            SupervisionError, match=r"bootstrap function raised ValueError\('bootstrap refused'\)"
        ):
            actors.booted.call().get(timeout=30)
        wait_until(lambda: faults, 30, "the owner to hear of the failure")
        assert "bootstrap refused" in str(faults[0]) and "HINT" in str(faults[0]), faults
    finally:
        procs.stop().get(timeout=10)
