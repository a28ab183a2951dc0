"""Tensor ops and endpoint calls keep their order both ways: an actor given a distributed tensor
sees the ops issued before its call, and an op issued after the call waits until the endpoint
has finished with the shard (never beside it). Procs the call does not reach do not wait, and
an endpoint that raises gives the shard back as one that returns does."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import torch

import monarch
import monarch.actor
from monarch.actor import Actor, SupervisionError, current_rank, endpoint, this_host

pytestmark = pytest.mark.timeout(60)


def _wait_for(pred, what: str, timeout: float = 30.0) -> None:
    """Poll ``pred`` (a condition of this proc, seen from the actor) until true; raise at the deadline."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def _later_ops_held_back() -> bool:
    """Whether this proc's tensor worker holds back the ops issued after the running call."""
    from monarch._src.tensor import worker

    return any(getattr(t, "holding_back", False) for t in list(worker.tables.values()))


class Holder(Actor):
    @endpoint
    def hold(self, x: torch.Tensor) -> list:
        """The shard's value once the op issued after this call either changed it (it ran
        beside this endpoint: the order is broken) or is held back until this endpoint ends."""
        before = x.clone()
        _wait_for(
            lambda: not torch.equal(x, before) or _later_ops_held_back(), "the op issued after the call"
        )
        return x.tolist()

    @endpoint
    def hold_until(self, x: torch.Tensor, gate: str) -> list:
        """The shard's value once ``gate`` exists (the test creates it)."""
        _wait_for(Path(gate).exists, f"{gate}")
        return x.tolist()

    @endpoint
    def both(self, x: torch.Tensor, y: torch.Tensor) -> list:
        return [x.tolist(), y.tolist()]

    @endpoint
    def fail(self, x: torch.Tensor) -> None:
        raise ValueError(f"no use for {x.tolist()} on {current_rank()['gpus']}")

    @endpoint
    def leave(self, x: torch.Tensor) -> None:
        raise SystemExit(f"leaving with {x.tolist()}")  # ends the actor, not just the call


@pytest.fixture(scope="module")
def holder(procs):
    return procs.spawn("holder", Holder)


def test_an_op_issued_after_the_call_waits_for_the_endpoint(procs, holder) -> None:
    with procs.activate():
        x = torch.zeros(3)
    seen = holder.hold.call(x)
    with procs.activate():
        x.add_(1)  # issued after the call, sent at once (the block ends)
    values = seen.get(timeout=40)
    assert [values.item(gpus=g) for g in (0, 1)] == [[0.0] * 3] * 2
    assert monarch.inspect(x, gpus=1).tolist() == [1.0] * 3  # and it ran once the endpoint ended


def test_procs_the_call_does_not_reach_do_not_wait(procs, holder, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with procs.activate():
        x = torch.zeros(2)
    seen = holder.slice(gpus=0).hold_until.call_one(x, str(gate))
    with procs.activate():
        x.add_(1)
    assert monarch.inspect(x, gpus=1).tolist() == [1.0, 1.0]  # while gpus=0's actor still holds x
    gate.touch()
    assert seen.get(timeout=40) == [0.0, 0.0]
    assert monarch.inspect(x, gpus=0).tolist() == [1.0, 1.0]


def test_an_endpoint_that_raises_gives_the_shard_back(procs, holder) -> None:
    with procs.activate():
        x = torch.zeros(2)
    failed = holder.fail.call(x)
    with procs.activate():
        x.add_(5)
    with pytest.raises(Exception, match="no use for \\[0.0, 0.0\\]"):
        failed.get(timeout=30)
    started = time.monotonic()
    assert monarch.fetch_shard(x, gpus=1).get(timeout=30).tolist() == [5.0, 5.0]
    assert time.monotonic() - started < 10  # the ops went on when the endpoint raised


def test_an_actor_that_fails_in_the_endpoint_holds_no_op_back(procs, monkeypatch) -> None:
    faults: list = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    fragile = procs.spawn("fragile", Holder)
    with procs.activate():
        x = torch.zeros(2)
    failed = fragile.leave.call(x)
    with procs.activate():
        x.add_(2)
    with pytest.raises(SupervisionError):
        failed.get(timeout=30)
    started = time.monotonic()
    assert [monarch.inspect(x, gpus=g).tolist() for g in (0, 1)] == [[2.0, 2.0]] * 2
    assert time.monotonic() - started < 10


def test_ops_waiting_past_the_lend_timeout_fail_naming_the_actor(tmp_path: Path) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1}, env={"MONARCH_TENSOR_LEND_TIMEOUT_S": "1"})
    try:
        slow = pm.spawn("slow_holder", Holder)
        gate = tmp_path / "gate"
        with pm.activate():
            x = torch.zeros(2)
        seen = slow.hold_until.call_one(x, str(gate))
        with pm.activate():
            x.add_(1)  # waits 1 s for hold_until, then fails instead of running beside it
        with pytest.raises(monarch.RemoteException, match="actor slow_holder.*after 1 s(.|\n)*HINT"):
            monarch.inspect(x)
        with pm.activate():
            y = torch.ones(2)
        assert monarch.inspect(y).tolist() == [1.0, 1.0]  # ops of later batches run again
        gate.touch()
        assert seen.get(timeout=30) == [0.0, 0.0]
    finally:
        pm.stop().get(timeout=10)


def test_a_call_with_two_tensors_gets_both(procs, holder) -> None:
    with procs.activate():
        x = torch.zeros(2)
        y = torch.ones(2)
    assert holder.both.call(x, y).get(timeout=30).item(gpus=1) == [[0.0, 0.0], [1.0, 1.0]]


def test_frees_of_another_mesh_sent_with_the_call_hold_nothing_back(procs, holder) -> None:
    one = procs.slice(gpus=1)
    with one.activate():
        gone = torch.ones(1)
    del gone
    gc.collect()  # its id waits to be freed: it goes out with the next batch, the call's own
    with procs.activate():
        x = torch.zeros(2)
    assert holder.hold_until.call(x, "/").get(timeout=30).item(gpus=1) == [0.0, 0.0]
