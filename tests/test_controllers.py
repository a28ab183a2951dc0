"""get_or_spawn_controller: one process-wide instance per name, living in the client."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

from helpers import IMPORT_TEST_MODULES

from monarch.actor import Actor, endpoint, get_or_spawn_controller

REPO = Path(__file__).resolve().parents[1]


class Controller(Actor):
    def __init__(self, token: str) -> None:
        self.token = token
        self.hits = 0

    @endpoint
    def identity(self) -> tuple:
        return (os.getpid(), id(self), self.token)

    @endpoint
    def hit(self) -> int:
        self.hits += 1
        return self.hits


class User(Actor):
    @endpoint
    def use_controller(self, name: str, token: str) -> tuple:
        c = get_or_spawn_controller(name, Controller, token).get(timeout=10)
        c.hit.call_one().get(timeout=10)
        return c.identity.call_one().get(timeout=10)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_same_instance_for_concurrent_callers():
    name = _unique("ctl")
    results: list = []
    errors: list = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            barrier.wait(10)
            mesh = get_or_spawn_controller(name, Controller, f"token{i}").get(timeout=20)
            mesh.hit.call_one().get(timeout=20)
            results.append(mesh.identity.call_one().get(timeout=20))
        except BaseException as e:  # collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(results) == 8
    pids, ids, tokens = zip(*results)
    assert set(pids) == {os.getpid()}  # controllers live in the client process
    assert len(set(ids)) == 1  # one instance...
    assert len(set(tokens)) == 1  # ...constructed once, by whichever caller came first
    again = get_or_spawn_controller(name, Controller, "late").get(timeout=10)
    assert again.hit.call_one().get(timeout=10) == 9  # every caller reached the same actor


def test_callable_from_inside_an_actor(procs1):
    name = _unique("ctl-in-actor")
    from_client = get_or_spawn_controller(name, Controller, "client").get(timeout=10)
    pid, ident, token = from_client.identity.call_one().get(timeout=10)
    user = procs1.spawn("user", User)
    assert user.use_controller.call_one(name, "actor").get(timeout=10) == (os.getpid(), ident, "client")
    assert from_client.hit.call_one().get(timeout=10) == 2


def test_actor_asks_first_in_a_fresh_client():
    code = IMPORT_TEST_MODULES + textwrap.dedent(
        """
        import os
        from actors import Pid
        from monarch.actor import Actor, endpoint, get_or_spawn_controller, this_host

        class User(Actor):
            @endpoint
            def ask(self):
                c = get_or_spawn_controller("first", Pid).get(timeout=10)
                return c.pid.call_one().get(timeout=10)

        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            u = pm.spawn("user", User)
            print("RESULT", u.ask.call_one().get(timeout=15) == os.getpid(), flush=True)
        finally:
            pm.stop().get(timeout=10)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=45, cwd=REPO)
    assert "RESULT True" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr
