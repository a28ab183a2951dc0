"""Fault injection: SIGKILL random processes of a 4-process mesh while calls are in flight.

A seeded random schedule sends rounds of calls, streams, chooses and broadcasts to random
slices of two actor meshes that share the processes, and kills processes between sending a
round and collecting it. Whatever happens, every call returns or raises ``SupervisionError``
within a bound, the client's ``unhandled_fault_hook`` hears of each failed (mesh, rank) exactly
once, and no worker process outlives the test.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

import cloudpickle
import psutil
import pytest

import monarch.actor
from monarch.actor import Actor, MeshFailure, SupervisionError, context, endpoint, this_host

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROCS = 4
ROUNDS = 12
KILLS = 3  # one process always survives, so some calls keep succeeding to the end
#: Bound on any single call's outcome once its round is collected.
CALL_BOUND_S = 5.0
DEADLINE_S = 15.0


class Target(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def work(self, seconds: float) -> int:
        time.sleep(seconds)  # keeps the call in flight while a process may be killed
        return context().actor_instance.rank.rank


class HookCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[tuple[str, int]] = collections.Counter()
        self.calls = 0

    def __call__(self, failure: MeshFailure) -> None:
        with self._lock:
            self.calls += 1
            for rank in failure.crashed_ranks:
                self.counts[(failure.mesh_name, rank)] += 1

    def snapshot(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self.counts)


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[HookCounter]:
    counter = HookCounter()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", counter)
    yield counter


def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def random_target(rng: random.Random, mesh: Any) -> tuple[Any, set[int]]:
    """A random slice of ``mesh`` and the ranks (of the full mesh) it covers."""
    shape = rng.choice(["all", "one", "range"])
    if shape == "all":
        return mesh, set(range(PROCS))
    if shape == "one":
        r = rng.randrange(PROCS)
        return mesh.slice(gpus=r), {r}
    lo = rng.randrange(PROCS - 1)
    hi = rng.randrange(lo + 1, PROCS + 1)
    return mesh.slice(gpus=slice(lo, hi)), set(range(lo, hi))


class Outcomes:
    def __init__(self) -> None:
        self.returned = 0
        self.raised = 0


def settle(fut: Any, outcomes: Outcomes, must_fail: bool, must_succeed: bool, label: str) -> None:
    """Resolve one future within the bound; check what the schedule requires of it."""
    t0 = time.monotonic()
    try:
        fut.get(timeout=CALL_BOUND_S)
    except SupervisionError:
        outcomes.raised += 1
        assert not must_succeed, f"{label} raised although none of its ranks was ever killed"
    except TimeoutError:
        pytest.fail(f"{label} neither returned nor raised within {CALL_BOUND_S}s")
    else:
        outcomes.returned += 1
        assert not must_fail, f"{label} returned although a rank it covers was killed before it was sent"
    assert time.monotonic() - t0 < CALL_BOUND_S + 1.0


@pytest.mark.parametrize("seed", [int(s) for s in os.environ.get("FI_SEEDS", "7,2024").split(",")])
def test_random_sigkills_during_traffic(seed: int, hook: HookCounter) -> None:
    rng = random.Random(seed)
    pm = this_host().spawn_procs(per_host={"gpus": PROCS})
    pids: list[int] = []
    names = [f"fi_a_{seed}", f"fi_b_{seed}"]
    outcomes = Outcomes()
    killed: list[int] = []
    try:
        meshes = [pm.spawn(name, Target) for name in names]
        pids = list(meshes[0].pid.call().get(timeout=DEADLINE_S).values())
        assert len(set(pids)) == PROCS
        kill_rounds = set(rng.sample(range(ROUNDS), KILLS))

        for round_no in range(ROUNDS):
            dead_before = set(killed)
            pending: list[tuple[Any, set[int], str]] = []
            for i in range(rng.randint(3, 8)):
                mesh = rng.choice(meshes)
                target, ranks = random_target(rng, mesh)
                kind = rng.choice(["call", "call_one", "stream", "choose", "broadcast"])
                if kind == "call_one" and len(ranks) != 1:
                    kind = "call"
                delay = rng.uniform(0.0, 0.02)
                label = f"round {round_no} #{i}: {mesh._mesh_name}{sorted(ranks)}.work.{kind}"
                ep = target.work
                if kind == "broadcast":
                    try:
                        ep.broadcast(delay)  # returns at once, or refuses a mesh known to be failed
                    except SupervisionError:
                        assert ranks & dead_before, f"{label} refused although no covered rank was killed"
                    continue
                if kind == "stream":
                    for fut in ep.stream(delay):
                        pending.append((fut, ranks, label))
                else:
                    pending.append((getattr(ep, kind)(delay), ranks, label))
            if round_no in kill_rounds:
                victim = rng.choice(sorted(set(range(PROCS)) - set(killed)))
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(victim)
            for fut, ranks, label in pending:
                # A stream or choose may be answered by a healthy rank; a call covering a rank
                # killed before it was sent can only fail; one never touching a killed rank succeeds.
                must_fail = bool(ranks & dead_before) and ("stream" not in label and "choose" not in label)
                must_succeed = not (ranks & set(killed))
                settle(fut, outcomes, must_fail, must_succeed, label)

        print(f"seed {seed}: killed {killed}, {outcomes.returned} returned, {outcomes.raised} raised")
        assert outcomes.returned > 0 and outcomes.raised > 0
        expected = {(name, r): 1 for name in names for r in killed}
        wait_until(lambda: hook.snapshot() == expected, DEADLINE_S, f"hook counts {expected}, got {hook.snapshot()}")
        # ... and no second report of the same (mesh, rank) trickles in afterwards.
        window = time.monotonic() + 0.5
        while time.monotonic() < window:
            assert hook.snapshot() == expected
            time.sleep(0.02)
        # The surviving process still serves both meshes.
        (survivor,) = set(range(PROCS)) - set(killed)
        for mesh in meshes:
            assert mesh.slice(gpus=survivor).work.call_one(0.0).get(timeout=DEADLINE_S) == survivor
    finally:
        pm.stop().get(timeout=DEADLINE_S)

    assert hook.snapshot() == {(name, r): 1 for name in names for r in killed}

    def all_gone() -> bool:
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                pass
        return True

    wait_until(all_gone, DEADLINE_S, f"worker processes {pids} to exit")
