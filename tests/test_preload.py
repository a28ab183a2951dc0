"""``spawn_procs(preload=...)``: workers forked from one template that imported modules once."""

from __future__ import annotations

import os
import random
import signal
import sys

import numpy as np
import pytest

import monarch.actor
from monarch.actor import Actor, SupervisionError, endpoint, this_host


class Probe(Actor):
    @endpoint
    def info(self) -> dict:
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "pgid": os.getpgid(0),
            "sid": os.getsid(0),
            "rank_env": os.environ.get("PROBE_RANK"),
            "preloaded": "colorsys" in sys.modules,
            "random": random.random(),
            "numpy_random": float(np.random.random()),
        }

    @endpoint
    def echo(self, x):
        return x


@pytest.fixture
def forked():
    pm = this_host().spawn_procs(
        per_host={"gpus": 3}, env=lambda p: {"PROBE_RANK": str(p.rank)}, preload=["colorsys", "numpy"]
    )
    yield pm
    pm.stop().get(timeout=20)


def test_workers_are_forked_from_one_template_and_set_up_as_their_own(forked):
    infos = list(forked.spawn("probe", Probe).info.call().get(timeout=30).values())
    parents = {i["ppid"] for i in infos}
    assert len(parents) == 1 and parents != {os.getpid()}  # one template, not the client
    for rank, info in enumerate(infos):
        assert info["pgid"] == info["pid"] == info["sid"]  # own session and process group
        assert info["rank_env"] == str(rank)  # its own environment
        assert info["preloaded"]
    assert len({i["pid"] for i in infos}) == 3
    assert len({i["random"] for i in infos}) == 3  # not the template's random state
    assert len({i["numpy_random"] for i in infos}) == 3


def test_stop_reports_each_forked_workers_exit_code(forked):
    assert forked.spawn("probe", Probe).echo.call(7).get(timeout=30).values() == [7, 7, 7]
    forked.stop().get(timeout=20)
    assert forked._owner.group.returncodes == [0, 0, 0]


def test_a_killed_forked_worker_is_reported_with_its_signal(forked, monkeypatch):
    faults: list = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    probe = forked.spawn("probe", Probe)
    pid = probe.slice(gpus=1).info.call_one().get(timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SupervisionError, match="SIGKILL"):
        probe.slice(gpus=1).echo.call_one(1).get(timeout=30)
    assert forked._owner.group.returncodes[1] == -signal.SIGKILL
    assert probe.slice(gpus=0).echo.call_one(2).get(timeout=30) == 2  # the others live on
    forked.stop().get(timeout=20)  # before the hook is restored
    assert len(faults) == 1 and "SIGKILL" in str(faults[0])


def test_a_module_that_fails_to_preload_does_not_stop_the_workers():
    pm = this_host().spawn_procs(per_host={"gpus": 1}, preload=["no_such_module_for_monarch_tests"])
    try:
        assert pm.spawn("probe", Probe).echo.call_one("ok").get(timeout=30) == "ok"
    finally:
        pm.stop().get(timeout=20)
