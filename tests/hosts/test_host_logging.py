"""Output of procs on agent hosts: forwarded to the client's console by default, aggregated on
request, made visible by the flush barrier (what a notebook cell's end runs), and shown
before the report of a proc's death.

Each test runs a client script in its own interpreter and checks what reached its stdout and
stderr, as a user would see it on a terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PRELUDE = """\
import asyncio, os, sys, time
import monarch.actor
from monarch.actor import Actor, endpoint, hosts_from_config
from monarch._src.host.log_capture import flush_barrier, live_worker_addresses


class Speaker(Actor):  # prints on its host: say its lines (to stderr with err), die last words

    @endpoint
    def say(self, lines: list[str], err: bool = False) -> None:
        for line in lines:
            print(line, file=sys.stderr if err else sys.stdout)

    @endpoint
    def die(self, text: str) -> None:
        print(text, flush=True)
        os._exit(7)


hosts = hosts_from_config("MONARCH_TEST_HOSTS")
procs = hosts.spawn_procs(per_host={"gpus": 1})
t = procs.spawn("t", Speaker)
"""


def run_client(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "client.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = {**os.environ, "MONARCH_TEST_HOSTS": "local:2", "MONARCH_LOG_DIR": str(tmp_path / "logs")}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=50, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "\x1e" not in proc.stdout + proc.stderr, "a control line leaked"
    return proc


def test_output_reaches_the_client_and_the_flush_barrier_shows_it_first(tmp_path: Path) -> None:
    proc = run_client(
        tmp_path,
        """
        t.say.call(["remote out"] * 2).get()
        t.say.call(["remote err"], True).get()
        assert len(live_worker_addresses()) == 2
        flush_barrier(live_worker_addresses())
        print("CLIENT END")
    """,
    )
    out = proc.stdout.splitlines()
    assert out == ["remote out"] * 4 + ["CLIENT END"]
    assert proc.stderr.splitlines().count("remote err") == 2


def test_similar_lines_from_both_hosts_are_aggregated(tmp_path: Path) -> None:
    proc = run_client(
        tmp_path,
        """
        asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=30))
        t.say.call(["aggregated line"] * 3).get()
        flush_barrier(live_worker_addresses())
        print("CLIENT END")
    """,
    )
    assert proc.stdout.splitlines() == ["[6 similar log lines] aggregated line", "CLIENT END"]


def test_a_dying_procs_last_words_come_before_its_failure(tmp_path: Path) -> None:
    proc = run_client(
        tmp_path,
        """
        faults = []
        monarch.actor.unhandled_fault_hook = faults.append
        try:
            t.slice(hosts=1).die.call_one("last words").get(timeout=20)
        except Exception as e:
            print(f"CALL FAILED: {e}")
    """,
    )
    out = proc.stdout.splitlines()
    assert out[0] == "last words", out
    assert out[1].startswith("CALL FAILED") and "exited with code 7" in out[1], out
