"""Shared fixtures. Every test is checked for leftover monarch worker processes."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest
from helpers import TESTS, alive, all_processes, kill_leftovers, wait_while

WORKER_MARK = "monarch._src.runtime.bootstrap"
#: Inherited by every process this test session starts (subprocess clients and their
#: workers too), so the leak check never touches another session's processes.
SESSION_ENV = "MONARCH_TEST_SESSION"
os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex)
SESSION = os.environ[SESSION_ENV]


def monarch_processes() -> list[psutil.Process]:
    """Running monarch worker processes started by this test session (descendants or orphans)."""
    found = []
    me = os.getpid()
    for p in all_processes(["cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if p.pid == me or not any(WORKER_MARK in c for c in cmd):
                continue
            if p.environ().get(SESSION_ENV) != SESSION:
                continue
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        found.append(p)
    return alive(found)


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail a test that leaves a monarch worker process behind (and kill the leftovers)."""
    before = {p.pid for p in monarch_processes()}
    yield
    left = wait_while(lambda: [p for p in monarch_processes() if p.pid not in before])
    if left:
        kill_leftovers(left)
        pytest.fail(f"test left monarch processes behind: {[p.pid for p in left]}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Ship the tests' own code (test modules, ``actors``, ``helpers``...) to workers by value.

    A test's actor classes and closures are defined in modules that a worker process should not
    import by name: that would run a test module (and pytest) inside the worker. Registering
    every module loaded from this directory once here covers each test module as it is
    collected, instead of a registration line at the top of each."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name == module.__name__ and path and Path(path).resolve().is_relative_to(TESTS):
            cloudpickle.register_pickle_by_value(module)


@pytest.fixture
def procs2() -> Iterator[object]:
    """A 2-process mesh {gpus: 2}, stopped after the test."""
    from monarch.actor import this_host

    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=10)


@pytest.fixture
def procs1() -> Iterator[object]:
    from monarch.actor import this_host

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm
    pm.stop().get(timeout=10)


@pytest.fixture
def gates2(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any, Any, list]]:
    """``(mesh, gates, pids, faults)``: ``Gate`` and ``Pid`` actors on a 2-process mesh, stopped
    after the test if it did not; the failures their owner hears of go to ``faults`` (the default
    hook exits), all of them once ``mesh.stop()`` returned."""
    from actors import Gate, Pid

    import monarch.actor
    from monarch.actor import this_host

    faults: list = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        yield pm, pm.spawn("gate", Gate), pm.spawn("pid", Pid), faults
    finally:
        with contextlib.suppress(Exception):
            pm.stop().get(timeout=10)
