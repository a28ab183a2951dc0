"""The library form: ``run_spmd`` / ``spmd_launcher`` from Python code, sync and awaited."""

from __future__ import annotations

import os
import sys

import pytest

from monarch.actor import Future, ValueMesh
from monarch.launch import ChildFailedError, SPMDLauncher, WorkerExit, run_spmd, spmd_launcher


def identity() -> tuple[int, str, str, str]:
    return (
        int(os.environ["RANK"]),
        os.environ["WORLD_SIZE"],
        os.environ["TORCHELASTIC_RESTART_COUNT"],
        os.environ.get("EXTRA", ""),
    )


def scaled(x: int, *, times: int = 1) -> int:
    return int(os.environ["RANK"]) * x * times


def fails_on_rank_1() -> None:
    import time

    if os.environ["RANK"] == "1":
        raise ValueError("boom from rank 1")
    time.sleep(30)


def dies_once() -> str:
    if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os._exit(7)
    return os.environ["TORCHELASTIC_RESTART_COUNT"]


def exits_with(code: int) -> None:
    sys.exit(code)


async def coroutine_fn() -> str:
    return "async " + os.environ["RANK"]


@pytest.mark.timeout(60)
def test_run_spmd_returns_each_ranks_value_as_a_value_mesh():
    fut = run_spmd(identity, nproc_per_node=2, env={"EXTRA": "x"})
    assert isinstance(fut, Future)
    result = fut.get(timeout=60)
    assert isinstance(result, ValueMesh)
    assert list(result.values()) == [(0, "2", "0", "x"), (1, "2", "0", "x")]
    assert run_spmd(scaled, args=(3,), kwargs={"times": 2}, nproc=2).get(timeout=60).item(gpus=1) == 6
    assert list(run_spmd(coroutine_fn, nproc=2).get(timeout=60).values()) == ["async 0", "async 1"]


@pytest.mark.timeout(60)
def test_run_spmd_with_preloaded_modules():
    result = run_spmd(identity, nproc_per_node=2, env={"EXTRA": "y"}, preload=["json"]).get(timeout=60)
    assert list(result.values()) == [(0, "2", "0", "y"), (1, "2", "0", "y")]


@pytest.mark.timeout(60)
async def test_await_a_launch_and_run_a_script(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os, sys\nprint('script rank', os.environ['RANK'], sys.argv[1:])\n")
    launcher = spmd_launcher(nproc_per_node=2)
    codes = await launcher.run(str(script), "--flag", 1)
    assert list(codes.values()) == [0, 0]
    values = await launcher.run(scaled, 5)
    assert list(values.values()) == [0, 5]


@pytest.mark.timeout(60)
def test_a_rank_raising_is_an_exception_with_torchrun_summary_and_the_cause():
    with pytest.raises(ChildFailedError) as info:
        run_spmd(fails_on_rank_1, nproc_per_node=2, kill_grace_period=2).get(timeout=60)
    err = info.value
    assert isinstance(err.__cause__, ValueError) and str(err.__cause__) == "boom from rank 1"
    rank, root = err.get_first_failure()
    assert (rank, root.exitcode) == (1, 1)
    assert "fails_on_rank_1 FAILED" in str(err)
    assert "ValueError: boom from rank 1" in str(err)
    assert err.failures[0].exitcode == -15  # the other rank was stopped with SIGTERM


@pytest.mark.timeout(60)
def test_restarts_and_exit_codes():
    assert list(run_spmd(dies_once, nproc_per_node=2, max_restarts=1).get(timeout=60).values()) == ["1", "1"]
    with pytest.raises(ChildFailedError) as info:
        run_spmd(dies_once, nproc_per_node=2).get(timeout=60)
    assert info.value.get_first_failure()[1].exitcode == 7
    with pytest.raises(ChildFailedError) as info:
        run_spmd(exits_with, args=(4,), nproc_per_node=1).get(timeout=60)
    assert isinstance(info.value.__cause__, WorkerExit) and info.value.__cause__.code == 4
    assert run_spmd(exits_with, args=(0,), nproc_per_node=1).get(timeout=60).item(gpus=0) is None


def test_options_are_checked_like_the_command_line():
    assert SPMDLauncher(nproc=3, standalone=True).config.nproc_per_node == 3
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        spmd_launcher(max_restarts=-1)
    with pytest.raises(ValueError, match="unrecognized arguments|invalid launcher option"):
        spmd_launcher(no_such_flag=1)
