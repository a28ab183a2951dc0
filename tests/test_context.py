"""context(): the running actor's instance, its rank, the message rank and the creator chain."""

from __future__ import annotations

import os

from monarch.actor import (
    Actor,
    Point,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    this_proc,
)


class Named(Actor):
    def __init__(self) -> None:
        self.init_rank = str(current_rank())

    @endpoint
    def where(self) -> dict:
        ctx = context()
        inst = ctx.actor_instance
        return {
            "rank": str(inst.rank),
            "message_rank": str(ctx.message_rank),
            "current_rank": str(current_rank()),
            "current_size": current_size(),
            "init_rank": self.init_rank,
            "instance": str(inst),
            "creator_name": inst.creator.name if inst.creator is not None else None,
            "name": inst.name,
            "actor_name": current_actor_name(),
            "pid": os.getpid(),
        }

    @endpoint
    def point(self) -> Point:
        return current_rank()

    @endpoint
    def spawn_child(self) -> dict:
        child = this_proc().spawn("child", Named)
        try:
            return child.where.call_one().get(timeout=10)
        finally:
            child.stop().get(timeout=10)


def test_client_context_is_root():
    ctx = context()
    assert str(ctx.actor_instance) == "<root>"
    assert len(ctx.message_rank) == 0
    assert str(current_rank()) == "{}"
    assert current_size() == {}


def test_ranks_in_a_full_call(procs2):
    m = procs2.spawn("the_name", Named)
    vm = m.where.call().get(timeout=10)
    for i, (point, info) in enumerate(vm.items()):
        assert point.rank == i
        assert info["rank"] == f"{{'gpus': {i}/2}}"
        assert info["message_rank"] == info["rank"]
        assert info["current_rank"] == info["rank"]
        assert info["init_rank"] == info["rank"]
        assert info["current_size"] == {"gpus": 2}


def test_point_repr_from_actor(procs2):
    m = procs2.spawn("named", Named)
    assert [str(p) for p in m.point.call().get(timeout=10).values()] == ["{'gpus': 0/2}", "{'gpus': 1/2}"]
    p = m.slice(gpus=1).point.call_one().get(timeout=10)
    assert isinstance(p, Point)


def test_message_rank_of_a_slice_differs_from_rank(procs2):
    m = procs2.spawn("named", Named)
    info = m.slice(gpus=1).where.call_one().get(timeout=10)
    assert info["rank"] == "{'gpus': 1/2}"
    assert info["message_rank"] == "{}"  # the sliced-away dimension is gone
    assert info["current_size"] == {}

    vm = m.slice(gpus=slice(1, 2)).where.call().get(timeout=10)
    (info,) = vm.values()
    assert info["rank"] == "{'gpus': 1/2}"
    assert info["message_rank"] == "{'gpus': 0/1}"
    assert info["current_size"] == {"gpus": 1}


def test_instance_string_and_creator(procs2):
    m = procs2.spawn("the_name", Named)
    info = m.slice(gpus=0).where.call_one().get(timeout=10)
    assert info["instance"] == f"<root>.<{Named.__module__}.Named the_name{{'gpus': 0/2}}>"
    assert info["creator_name"] == "root"
    assert info["name"] == "the_name"
    assert isinstance(info["actor_name"], str) and info["actor_name"]


def test_creator_of_an_actor_spawned_by_an_actor(procs1):
    m = procs1.spawn("parent", Named)
    parent = m.where.call_one().get(timeout=10)
    child = m.spawn_child.call_one().get(timeout=10)
    assert child["creator_name"] == "parent"
    assert child["pid"] == parent["pid"]  # this_proc() inside an actor is that actor's process
    assert child["instance"].startswith(parent["instance"] + ".<")
    assert child["instance"].endswith("Named child{}>")
