"""A failed remote op: its tensors and those computed from them raise its remote traceback when
fetched, the rest stay usable. Freed handles free their remote values."""

from __future__ import annotations

import gc

import pytest
import torch

import monarch
from monarch._src.tensor.controller import BATCH_LIMIT, controller_for

pytestmark = pytest.mark.timeout(120)


def remote_values(pm) -> list[int]:
    """How many values each proc's tensor worker holds (after everything issued so far)."""
    ctl = controller_for(pm)
    ctl.flush()
    return [s["values"] for s in ctl.root_ctx.workers.stats.call().get(timeout=30).values()]


def test_a_failed_op_fails_its_dependents_and_nothing_else(procs):
    with procs.activate():
        x = torch.arange(3)
        bad_index = torch.tensor([5])
        y = x[bad_index]  # the shape is fine; the value is out of range on every proc
        z = (y + 1) * 2  # computed from y: fails the same way, without running
        w = x * 10  # independent: fine
    assert y.shape == (1,)  # the client cannot know; it learns at fetch time
    with pytest.raises(monarch.RemoteException) as raised:
        monarch.inspect(z, gpus=1)
    message = str(raised.value)
    assert "index 5 is out of bounds" in message and "Traceback" in message and "rank 1" in message
    with pytest.raises(monarch.RemoteException, match="out of bounds"):
        monarch.inspect(y)
    assert monarch.inspect(w, gpus=1).tolist() == [0, 10, 20]
    # the mesh keeps working: new ops, and in-place repair of nothing-related tensors
    with procs.activate():
        again = x + 1
    assert monarch.inspect(again).tolist() == [1, 2, 3]


def test_one_failure_reported_once_per_fetch_in_a_pytree(procs):
    with procs.activate():
        good = torch.ones(2)
        bad = torch.ones(2)[torch.tensor([7])]
    with pytest.raises(monarch.RemoteException):
        monarch.fetch_shard([good, bad]).get(timeout=30)
    assert monarch.fetch_shard([good]).get(timeout=30)[0].tolist() == [1.0, 1.0]


@pytest.mark.slow
def test_freed_handles_free_remote_values_over_100k_ops(procs):
    gc.collect()
    base = max(remote_values(procs))
    peak = 0
    with procs.activate():
        t = torch.zeros(4)
        for i in range(100_000):
            t = t + 1
            if i % 20_000 == 0:
                peak = max(peak, *remote_values(procs))
    assert monarch.inspect(t, gpus=1).tolist() == [100_000.0] * 4
    # at most the live handles plus one batch of frees not yet sent, whatever the op count
    assert peak <= base + 2 * BATCH_LIMIT + 2
    del t
    gc.collect()
    assert max(remote_values(procs)) <= base


def test_a_dropped_handle_is_freed_with_the_next_batch(procs):
    gc.collect()
    base = remote_values(procs)
    with procs.activate():
        big = [torch.ones(8) for _ in range(10)]
    assert [v - b for v, b in zip(remote_values(procs), base)] == [10, 10]
    del big
    gc.collect()
    assert remote_values(procs) == base


def test_handles_freed_on_two_meshes_of_the_same_procs_free_their_values(procs):
    baseline = remote_values(procs)
    flat = procs.flatten("all")  # the same procs, another shape: a mesh of its own to the engine
    with procs.activate():
        a = torch.ones(2)
    with flat.activate():
        b = torch.ones(2)
    with procs.activate():
        c = a + 1
    assert remote_values(procs) == [v + 3 for v in baseline]
    del a, b, c
    gc.collect()
    assert remote_values(procs) == baseline  # each mesh's frees went out, whichever is active
