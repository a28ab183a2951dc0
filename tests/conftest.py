"""Shared fixtures. Every test is checked for leftover monarch worker processes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psutil
import pytest
from helpers import alive, kill_leftovers, wait_while

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
    for p in psutil.process_iter(["cmdline"]):
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
