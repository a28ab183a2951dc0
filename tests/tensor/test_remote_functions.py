"""``monarch.remote``: free functions run on the procs of the active mesh, with the adverbs, as
tensor ops (``rref``, calling it), and through ``send(..., port=...)``."""

from __future__ import annotations

import os

import pytest
import torch

import monarch
from monarch.actor import Channel, ValueMesh, send

pytestmark = pytest.mark.timeout(90)


@monarch.remote
def pid() -> int:
    return os.getpid()


@monarch.remote
def scaled(x: torch.Tensor, by: float) -> torch.Tensor:
    return x * by


@monarch.remote(propagate=lambda x: torch.empty(x.shape[0], 2))
def pairs(x: torch.Tensor) -> torch.Tensor:
    return torch.stack([x, -x], dim=1)


@monarch.remote
def shard_sum(x: torch.Tensor) -> float:
    return float(x.sum())


@monarch.remote(propagate=lambda x: x)
def fails(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("remote function refused")


def test_adverbs_run_the_function_on_each_proc(procs):
    with procs.activate():
        pids = pid.call().get(timeout=30)
        one = pid.choose().get(timeout=30)
        streamed = sorted(f.get(timeout=30) for f in pid.stream())
        pid.broadcast()
    assert isinstance(pids, ValueMesh) and len(pids) == 2
    values = sorted(pids.values())
    assert os.getpid() not in values and len(set(values)) == 2
    assert one in values and streamed == values
    with procs.slice(gpus=1).activate():
        assert pid.call_one().get(timeout=30) == pids.item(gpus=1)


def test_calling_it_makes_a_distributed_tensor_in_op_order(procs):
    with procs.activate():
        x = torch.ones(3)
        y = scaled(x, 3.0)  # calling = rref
        x.add_(1)  # after y: y saw the old x
        z = pairs.rref(x)
        total = shard_sum.call(x)  # the adverbs see every op issued before them
    assert y.shape == (3,) and z.shape == (3, 2)
    assert monarch.inspect(y).tolist() == [3.0, 3.0, 3.0]
    assert monarch.inspect(z, gpus=1).tolist() == [[2.0, -2.0]] * 3
    assert list(total.get(timeout=30).values()) == [6.0, 6.0]


def test_named_function(procs):
    with procs.activate():
        t = monarch.remote("torch.ones", propagate=lambda *s: torch.empty(*s))(2)
        s = monarch.remote("torch.zeros")(4)  # shaped by running torch.zeros on meta
    assert monarch.inspect(t).tolist() == [1.0, 1.0] and s.shape == (4,)


def test_an_error_in_a_remote_function_surfaces_at_fetch(procs):
    with procs.activate():
        bad = fails(torch.ones(2))
        after = bad + 1
    with pytest.raises(monarch.RemoteException, match="remote function refused"):
        monarch.inspect(after)


def test_send_delivers_each_procs_result_to_a_port(procs):
    port, recv = Channel.open()
    with procs.activate():
        send(pid, args=(), kwargs={}, port=port)
    got = sorted(recv.recv().get(timeout=30) for _ in range(2))
    with procs.activate():
        assert got == sorted(pid.call().get(timeout=30).values())


def test_without_propagate_the_shape_comes_from_running_the_function_on_meta(procs):
    @monarch.remote
    def refuses_meta(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("no meta here")

    with procs.activate(), pytest.raises(RuntimeError, match="HINT: give propagate="):
        refuses_meta(torch.ones(2))


def test_outside_an_active_mesh_monarchs_error():
    expected = "Calling a 'remote' monarch function requires an active proc_mesh"
    with pytest.raises(ValueError, match=expected):
        pid.call()
    with pytest.raises(ValueError, match=expected):
        scaled(torch.ones(2), 2.0)
