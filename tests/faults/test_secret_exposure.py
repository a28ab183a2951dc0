"""The job secret never sits in a process's environment, where anyone allowed to read
``/proc/<pid>/environ`` (or a core dump, or ``ps eww``) would find it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from monarch._src.actor.process_state import runtime  # internal: the secret to look for
from monarch.actor import Actor, endpoint, this_host


class Pids(Actor):
    @endpoint
    def pids(self) -> list[int]:
        return [os.getpid(), os.getppid()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("preload", [(), ("json",)], ids=["exec", "forked_from_template"])
def test_secret_is_not_in_any_worker_environment(preload):
    secret = runtime().secret
    pm = this_host().spawn_procs(per_host={"gpus": 2}, preload=preload)
    try:
        replies = pm.spawn("pids", Pids).pids.call().get(timeout=30).values()
        pids = {p for pair in replies for p in pair} - {os.getpid()}
        assert len(pids) == 2 + bool(preload)  # the workers (and their template)
        for pid in pids:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert secret not in environ and secret.hex().encode() not in environ.lower(), pid
    finally:
        pm.stop().get(timeout=10)
