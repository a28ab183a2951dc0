"""``with procs.activate():``: torch ops make distributed tensors, computed on every proc in order,
shipped in batches; ``fetch_shard``/``inspect`` read one proc's value; outside, torch is torch."""

from __future__ import annotations

import pytest
import torch

import monarch
from monarch._src.tensor.controller import BATCH_LIMIT, controller_for

pytestmark = pytest.mark.timeout(90)


def worker_stats(pm) -> list[dict[str, int]]:
    """What each proc's tensor worker holds and how many batches it ran."""
    return list(controller_for(pm).root_ctx.workers.stats.call().get(timeout=30).values())


def test_factories_and_ops_give_handles_whose_shape_is_known_at_once(procs):
    with procs.activate():
        t = torch.rand(3, 4)
        u = t @ t.T
        s = u.sum(dim=1, keepdim=True).to(torch.float64)
    assert isinstance(t, monarch.Tensor) and isinstance(t, torch.Tensor)
    assert t.shape == (3, 4) and t.dtype == torch.float32
    assert u.shape == (3, 3)
    assert s.shape == (3, 1) and s.dtype == torch.float64
    # print(t) describes the tensor; it never shows (or waits for) a value
    text = repr(t)
    assert text.startswith("monarch.Tensor(") and "shape=(3, 4)" in text and "gpus" in text
    assert str(t) == text and f"{t}" == text


def test_each_proc_computes_on_its_own_values(procs):
    with procs.activate():
        t = torch.rand(3, 4)
        u = t @ t.T
        v = u + 1
        v.mul_(2)  # in place: same handle
    shards = [monarch.fetch_shard(t, gpus=g).get(timeout=30) for g in (0, 1)]
    assert not torch.equal(shards[0], shards[1])  # torch.rand: each proc its own values
    for g in (0, 1):
        local = shards[g]
        assert torch.allclose(monarch.inspect(v, gpus=g), (local @ local.T + 1) * 2)
        assert type(monarch.inspect(v, gpus=g)) is torch.Tensor


def test_fetch_shard_takes_a_pytree_and_a_shard_dict(procs):
    with procs.activate():
        a = torch.full((2,), 3.0)
        b = torch.arange(4)
    got = monarch.fetch_shard({"a": a, "rest": [b, "label"]}, {"gpus": 1}).get(timeout=30)
    assert torch.equal(got["a"], torch.full((2,), 3.0))
    assert torch.equal(got["rest"][0], torch.arange(4)) and got["rest"][1] == "label"
    with pytest.raises(ValueError, match="no dimension 'hosts'"):
        monarch.fetch_shard(a, hosts=0)
    with pytest.raises(IndexError, match="gpus=2"):
        monarch.fetch_shard(a, gpus=2)


async def test_fetch_shard_is_awaitable(procs):
    with procs.activate():
        t = torch.ones(2) * 5
    assert torch.equal(await monarch.fetch_shard(t, gpus=1), torch.full((2,), 5.0))


def test_outside_an_active_mesh_torch_is_torch(procs):
    assert monarch.get_active_mesh() is None
    plain = torch.ones(2) + 1
    assert type(plain) is torch.Tensor and plain.tolist() == [2.0, 2.0]
    with procs.activate():
        assert monarch.get_active_mesh() is procs
        inside = torch.ones(2)
        with monarch.no_mesh.activate():
            assert monarch.get_active_mesh() is None
            local = torch.ones(2) + 1
            assert type(local) is torch.Tensor and local.tolist() == [2.0, 2.0]
        also_local = local * 2  # client tensors only: a local op, even under activate()
    assert type(also_local) is torch.Tensor and also_local.tolist() == [4.0, 4.0]
    assert type(inside) is monarch.Tensor
    assert monarch.get_active_mesh() is None


def test_reading_values_on_the_client_is_refused_with_a_hint(procs):
    with procs.activate():
        t = torch.ones(())
        with pytest.raises(RuntimeError, match="HINT: copy a shard here first"):
            t.item()
        with pytest.raises(RuntimeError, match="needs the values"):
            bool(t)
    # shape errors show at once, on the client, like torch's own
    with procs.activate(), pytest.raises(RuntimeError):
        torch.ones(2, 3) @ torch.ones(2, 3)


def test_ops_travel_in_batches_not_one_message_each(procs):
    before = worker_stats(procs)
    n = 4 * BATCH_LIMIT
    with procs.activate():
        t = torch.zeros(2)
        for _ in range(n):
            t = t + 1
    assert torch.equal(monarch.inspect(t, gpus=1), torch.full((2,), float(n)))
    after = worker_stats(procs)
    for b, a in zip(before, after):
        assert a["batches"] - b["batches"] <= 6  # n ops, not n messages


def test_client_tensors_used_in_ops_travel_as_constants(procs):
    weights = torch.tensor([1.0, 2.0, 3.0])
    with procs.activate():
        t = torch.ones(3) * weights
        t[0] = 7.0  # item assignment is an op too
    assert monarch.inspect(t, gpus=1).tolist() == [7.0, 2.0, 3.0]


def test_torch_tensor_and_as_tensor_of_client_data_make_distributed_tensors(procs):
    data = torch.arange(3.0)
    with procs.activate():
        a = torch.as_tensor(data)
        b = torch.tensor([1.0, 2.0])
    assert type(a) is monarch.Tensor and type(b) is monarch.Tensor
    assert monarch.inspect(a, gpus=1).tolist() == [0.0, 1.0, 2.0] and monarch.inspect(b).tolist() == [
        1.0,
        2.0,
    ]
