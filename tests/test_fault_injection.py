"""Fault injection: SIGKILL random processes of a 4-process mesh while calls are in flight.

A seeded random schedule sends rounds of calls, streams, chooses and broadcasts to random
slices of two actor meshes that share the processes, and kills processes between sending a
round and collecting it. Whatever happens, every call returns or raises ``SupervisionError``
within a bound, the client's ``unhandled_fault_hook`` hears of each failed (mesh, rank) exactly
once, and no worker process outlives the test.

``FI_SEEDS=1,2,3 pytest tests/test_fault_injection.py`` runs other schedules (a soak).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from actors import Pid
from helpers import wait_gone, wait_until

import monarch.actor
from monarch.actor import Actor, MeshFailure, SupervisionError, context, endpoint, this_host

PROCS = 4
ROUNDS = 12
KILLS = 3  # one process always survives, so some calls keep succeeding to the end
#: Bound on any single call's outcome once its round is collected.
CALL_BOUND_S = 5.0
DEADLINE_S = 15.0


class Target(Pid):
    @endpoint
    def work(self, seconds: float) -> int:
        time.sleep(seconds)  # keeps the call in flight while a process may be killed
        return context().actor_instance.rank.rank


class Supervisor(Actor):
    """Owns the target mesh; counts the failures its ``__supervise__`` is told about."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        self.mesh: Any = None

    @endpoint
    def spawn_target(self, procs: Any, name: str) -> Any:
        self.mesh = procs.spawn(name, Target)
        self.mesh.pid.call().get(timeout=10)  # every rank exists before the mesh is handed out
        return self.mesh

    @endpoint
    def counts_seen(self) -> dict[tuple[str, int], int]:
        return dict(self.counts)

    def __supervise__(self, failure: MeshFailure) -> bool:
        for rank in failure.crashed_ranks:
            key = (failure.mesh_name, rank)
            self.counts[key] = self.counts.get(key, 0) + 1
        return True


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


SEEDS = [int(s) for s in os.environ.get("FI_SEEDS", "7,2024").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
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
                which = rng.randrange(len(meshes))
                mesh = meshes[which]
                target, ranks = random_target(rng, mesh)
                kind = rng.choice(["call", "call_one", "stream", "choose", "broadcast"])
                if kind == "call_one" and len(ranks) != 1:
                    kind = "call"
                delay = rng.uniform(0.0, 0.02)
                label = f"round {round_no} #{i}: {names[which]}{sorted(ranks)}.work.{kind}"
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
        wait_until(
            lambda: hook.snapshot() == expected, DEADLINE_S, f"hook counts {expected}, got {hook.snapshot()}"
        )
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

    assert wait_gone(pids, DEADLINE_S) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_random_sigkills_reach_the_owning_actor_once(seed: int, hook: HookCounter) -> None:
    """Same chaos, but the mesh is owned by an actor in another process (told via lost peers)."""
    rng = random.Random(seed)
    ctl = this_host().spawn_procs(per_host={"gpus": 1})
    pm = this_host().spawn_procs(per_host={"gpus": PROCS})
    pids: list[int] = []
    name = f"fi_owned_{seed}"
    killed: list[int] = []
    outcomes = Outcomes()
    try:
        sup = ctl.spawn(f"fi_supervisor_{seed}", Supervisor)
        mesh = sup.spawn_target.call_one(pm, name).get(timeout=DEADLINE_S)
        pids = list(mesh.pid.call().get(timeout=DEADLINE_S).values())
        kill_rounds = set(rng.sample(range(ROUNDS), KILLS))
        for round_no in range(ROUNDS):
            dead_before = set(killed)
            pending = []
            for i in range(rng.randint(2, 6)):
                target, ranks = random_target(rng, mesh)
                pending.append(
                    (
                        target.work.call(rng.uniform(0.0, 0.02)),
                        ranks,
                        f"round {round_no} #{i}: {sorted(ranks)}",
                    )
                )
            if round_no in kill_rounds:
                victim = rng.choice(sorted(set(range(PROCS)) - set(killed)))
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(victim)
            for fut, ranks, label in pending:
                settle(fut, outcomes, bool(ranks & dead_before), not (ranks & set(killed)), label)
        expected = {(name, r): 1 for r in killed}
        seen = lambda: sup.counts_seen.call_one().get(timeout=DEADLINE_S)  # noqa: E731
        wait_until(lambda: seen() == expected, DEADLINE_S, f"supervisor counts {expected}")
        window = time.monotonic() + 0.5
        while time.monotonic() < window:
            assert seen() == expected
            time.sleep(0.02)
        assert hook.snapshot() == {}  # handled by the owner: the client is never involved
    finally:
        pm.stop().get(timeout=DEADLINE_S)
        ctl.stop().get(timeout=DEADLINE_S)
    assert hook.snapshot() == {}
