"""A message over the receiver's MONARCH_MAX_FRAME_BYTES fails at its sender, and only it.

The receiver reads the header of the oversized frame (after the handshake), skips its body and
answers the reply port with the error naming the limit; the connection stays up, so the calls
sent behind it on the same connection all complete, in order.
"""

from __future__ import annotations

import os
import threading

import pytest
from fault_helpers import Probe, probe_worker
from helpers import REPO, run_python

import monarch.actor
from monarch.actor import this_host

LIMIT = 200_000
SMALL_LIMIT_ENV = {"MONARCH_MAX_FRAME_BYTES": str(LIMIT)}


@pytest.mark.timeout(60)
def test_oversize_call_fails_and_the_200_calls_behind_it_complete():
    with probe_worker(SMALL_LIMIT_ENV) as (probe, _, _):
        big = probe.length.call_one(b"x" * (LIMIT + 100_000))
        behind = [probe.length.call_one(b"y" * i) for i in range(200)]
        with pytest.raises(Exception) as info:
            big.get(timeout=10)
        message = str(info.value)
        assert "rejecting oversize frame" in message and f"max={LIMIT}" in message, message
        assert "receiving side" in message and "MONARCH_MAX_FRAME_BYTES" in message and "HINT" in message
        assert [f.get(timeout=10) for f in behind] == list(range(200))


@pytest.mark.timeout(60)
def test_oversize_broadcast_is_a_supervision_event(monkeypatch):
    failures: list[object] = []
    reported = threading.Event()

    def hook(failure):
        failures.append(failure)
        reported.set()

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", hook)
    pm = this_host().spawn_procs(per_host={"gpus": 1}, env=SMALL_LIMIT_ENV)
    try:
        probe = pm.spawn("probe", Probe)
        assert probe.length.call_one(b"x").get(timeout=30) == 1
        probe.length.broadcast(b"x" * (LIMIT + 100_000))
        assert reported.wait(timeout=10), "no supervision event for the rejected broadcast"
        report = failures[0].report()
        assert "could not receive a message for its endpoint length()" in report, report
        assert "MONARCH_MAX_FRAME_BYTES" in report
    finally:
        pm.stop().get(timeout=10)


@pytest.mark.timeout(60)
def test_the_receivers_limit_holds_for_a_message_sent_through_shared_memory():
    # Over 1 MiB, a body travels as a /dev/shm file; the receiver must still refuse it by its
    # own limit (the sender's is 10 GiB), and release the file so nothing is lost or leaked.
    limit = 1_500_000
    with probe_worker({"MONARCH_MAX_FRAME_BYTES": str(limit)}) as (probe, _, _):
        big = probe.length.call_one(b"x" * 2_000_000)
        behind = [probe.length.call_one(b"y" * i) for i in range(50)]
        with pytest.raises(Exception) as info:
            big.get(timeout=10)
        message = str(info.value)
        assert "receiving side" in message and f"max={limit}" in message, message
        assert "MONARCH_MAX_FRAME_BYTES" in message and "HINT" in message
        assert [f.get(timeout=10) for f in behind] == list(range(50))
        # The refused message's file went back to the sender's pool and serves the next one.
        assert probe.length.call_one(b"z" * 1_200_000).get(timeout=10) == 1_200_000


UNPOOLED_CLIENT = """
import glob, os
from fault_helpers import Probe
from monarch._src.actor.process_state import runtime
from monarch.actor import this_host

pm = this_host().spawn_procs(per_host={"gpus": 1}, env={"MONARCH_MAX_FRAME_BYTES": "1500000"})
probe = pm.spawn("probe", Probe)
try:
    probe.length.call_one(b"x" * 2_000_000).get(timeout=10)
    print("accepted")
except Exception as e:
    print("refused:", "receiving side" in str(e))
print("behind:", probe.length.call_one(b"y").get(timeout=10))
print("files:", len(glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*")))
pm.stop().get(timeout=10)
"""


@pytest.mark.timeout(60)
def test_a_refused_exported_file_is_removed():
    # Without a pool the sender exports a fresh file and forgets it: the receiver that
    # refuses the message must remove it, or it stays in /dev/shm until the job ends.
    here = os.path.dirname(os.path.abspath(__file__))
    done = run_python(UNPOOLED_CLIENT, 50, MONARCH_SHM_POOL_BYTES="0", PYTHONPATH=f"{REPO}:{here}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["refused: True", "behind: 1", "files: 0"], done.stdout
