"""A job started under a low soft descriptor limit (1,024 on many systems) raises it to the
hard limit: a client whose reply addresses each hold a connection per worker would run out
long before the machine does (``runtime/fd_limit.py``)."""

from __future__ import annotations

import json
import resource

import pytest
from helpers import run_python

LOW = 256

SCRIPT = f"""
import json, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, ({LOW}, hard))  # as a login shell may start it
from monarch.actor import Actor, endpoint, this_host

class Limit(Actor):
    @endpoint
    def soft(self):
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]

procs = this_host().spawn_procs(per_host={{"gpus": 1}})
worker = procs.spawn("limit", Limit).soft.call_one().get(timeout=30)
print("LIMITS", json.dumps([resource.getrlimit(resource.RLIMIT_NOFILE)[0], worker]))
procs.stop().get(timeout=30)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("setting", ["1", "0"], ids=["raised", "left-alone"])
def test_a_low_soft_descriptor_limit_is_raised_to_the_hard_one(setting: str) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= LOW:
        pytest.skip(f"this machine's hard descriptor limit ({hard}) leaves nothing to raise")
    proc = run_python(SCRIPT, timeout=50, MONARCH_RAISE_FD_LIMIT=setting)
    assert proc.returncode == 0, proc.stderr
    [limits] = [
        json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("LIMITS ")
    ]
    raised = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    assert limits == ([raised, raised] if setting == "1" else [LOW, LOW])
