"""Shared-memory files lent for large payloads are reused, and never while still in use."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from monarch._src.actor.process_state import runtime
from monarch.actor import Actor, endpoint

REPO = Path(__file__).resolve().parents[1]
ELEMS = (4 << 20) // 8  # 4 MiB of float64: well above the shared-memory threshold


class Keeper(Actor):
    def __init__(self) -> None:
        self.kept: list = []

    @endpoint
    def total(self, x) -> float:
        return float(x.sum())

    @endpoint
    def keep(self, x) -> None:
        self.kept.append(x)

    @endpoint
    def keep_slice(self, x) -> None:
        self.kept.append(x[10:20])  # a view: the full array is dropped, its memory is not

    @endpoint
    def kept_totals(self) -> list:
        return [float(k.sum()) for k in self.kept]

    @endpoint
    def make(self, fill: float) -> np.ndarray:
        return np.full(ELEMS, fill)


@pytest.fixture
def keeper(procs1):
    return procs1.spawn("keeper", Keeper)


def _job_files() -> list[str]:
    return glob.glob(f"/dev/shm/monarch-{runtime().job_tag}-*")


def test_kept_arrays_are_not_overwritten_by_later_sends(keeper):
    keeper.keep.call_one(np.full(ELEMS, 1.0)).get(timeout=30)
    keeper.keep_slice.call_one(np.full(ELEMS, 2.0)).get(timeout=30)
    for fill in range(3, 9):  # each of these is given back, and its file reused
        assert keeper.total.call_one(np.full(ELEMS, float(fill))).get(timeout=30) == fill * ELEMS
    assert keeper.kept_totals.call_one().get(timeout=30) == [ELEMS * 1.0, 10 * 2.0]


def test_given_back_files_are_reused(keeper):
    before = set(_job_files())  # earlier tests in this client may have left free files
    for fill in range(10):
        assert keeper.total.call_one(np.full(ELEMS, float(fill))).get(timeout=30) == fill * ELEMS
    # The receiver unlinked none of them, and they were reused: at most one new file per
    # payload in flight at a time (two when a give-back is still on its way), not one per send.
    assert _job_files()
    assert len(set(_job_files()) - before) <= 2


def test_results_the_client_keeps_stay_intact(keeper):
    results = [keeper.make.call_one(float(i)).get(timeout=30) for i in range(6)]
    assert [float(r[0]) for r in results] == [float(i) for i in range(6)]
    assert all(float(r.sum()) == i * ELEMS for i, r in enumerate(results))
    del results
    again = keeper.make.call_one(7.0).get(timeout=30)
    assert float(again.sum()) == 7.0 * ELEMS


#: A client script (run in its own interpreter, to set the pool's environment): one actor
#: summing a 4 MiB array, and ``files()``, this job's shared-memory files.
CHILD_PRELUDE = (
    "import glob, numpy as np, time\n"
    "from monarch.actor import Actor, endpoint, this_host\n"
    "from monarch._src.actor.process_state import runtime\n"
    "class A(Actor):\n"
    "    @endpoint\n"
    "    def total(self, x):\n"
    "        return float(x.sum())\n"
    "pm = this_host().spawn_procs(per_host={'gpus': 1})\n"
    "a = pm.spawn('a', A)\n"
    "files = lambda: glob.glob(f'/dev/shm/monarch-{runtime().job_tag}-*')\n"
    f"print(a.total.call_one(np.full({ELEMS}, 3.0)).get(timeout=30))\n"
)


def _run_child(body: str, **env: str) -> list[str]:
    code = CHILD_PRELUDE + body + "pm.stop().get(timeout=10)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=dict(os.environ, **env),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_pool_turned_off_still_delivers_and_leaves_no_files():
    assert _run_child("print(len(files()))\n", MONARCH_SHM_POOL_BYTES="0") == [str(3.0 * ELEMS), "0"]


def test_send_pool_reuses_evicts_and_cleans_up():
    from monarch._src.runtime.shm import SendPool

    mib = 1 << 20
    pool = SendPool("job-pooltest", budget=3 * mib)
    try:
        a = pool.lend(memoryview(b"a" * mib), "peer-1")
        b = pool.lend(memoryview(b"b" * (2 * mib)), "peer-1")
        assert a is not None and b is not None and a != b
        assert pool.lend(memoryview(b"c" * mib), "peer-2") is None  # budget full, all lent
        assert pool.lend(memoryview(b"d" * (4 * mib)), "peer-2") is None  # larger than the budget
        pool.give_back([a.decode()])
        assert pool.lend(memoryview(b"e" * mib), "peer-2") == a  # reused, not a new file
        with open(f"/dev/shm/{a.decode()}", "rb") as f:
            assert f.read(2) == b"ee"
        pool.reclaim("peer-1")  # peer-1 died: its 2 MiB file is free, and is evicted for a 3 MiB one
        pool.reclaim("peer-2")
        c = pool.lend(memoryview(b"f" * (3 * mib)), "peer-3")
        assert c is not None
        assert sorted(glob.glob("/dev/shm/monarch-job-pooltest-*")) == [f"/dev/shm/{c.decode()}"]
    finally:
        pool.close()
    assert glob.glob("/dev/shm/monarch-job-pooltest-*") == []


def test_a_result_outlives_the_process_that_lent_it():
    from monarch.actor import this_host

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    keeper = pm.spawn("keeper", Keeper)
    result = keeper.make.call_one(5.0).get(timeout=30)
    pm.stop().get(timeout=30)  # the lender is gone, and its files are unlinked
    assert float(result.sum()) == 5.0 * ELEMS  # the mapping stays valid
    result[:] = 1.0  # and private to this process
    assert float(result.sum()) == ELEMS
    del result  # giving it back to a process that is gone is a no-op


def test_send_pool_trims_files_left_unused():
    from monarch._src.runtime.shm import SendPool

    pool = SendPool("job-pooltrim", budget=4 << 20)
    try:
        name = pool.lend(memoryview(b"x" * (1 << 20)), "peer")
        assert name is not None
        assert pool.trim(idle_s=0) is False  # lent: never trimmed
        pool.give_back([name.decode()])
        assert pool.trim(idle_s=3600) is True  # free, but not idle long enough
        assert glob.glob("/dev/shm/monarch-job-pooltrim-*") == [f"/dev/shm/{name.decode()}"]
        assert pool.trim(idle_s=0) is False
        assert glob.glob("/dev/shm/monarch-job-pooltrim-*") == []
    finally:
        pool.close()


def test_an_idle_pool_gives_its_memory_back():
    wait_for_trim = (
        "print(len(files()))\n"
        "deadline = time.monotonic() + 20\n"
        "while files() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print(len(files()))\n"
    )
    # Kept for reuse, then removed once idle for a second.
    assert _run_child(wait_for_trim, MONARCH_SHM_POOL_IDLE_S="1") == [str(3.0 * ELEMS), "1", "0"]
