"""Meshes, actors and host meshes on agent hosts passed between actors as references: the
guide's DataLoader/Trainer example across hosts, spawning on a host mesh from an actor, and
references that refuse to shut the hosts down."""

from __future__ import annotations

import os
import pickle

import pytest
from actors import Pid

from monarch.actor import Actor, context, endpoint, this_proc

pytestmark = pytest.mark.timeout(60)


class DataLoader(Actor):
    def __init__(self) -> None:
        self.i = 0

    @endpoint
    def example(self) -> str:
        self.i += 1
        return f"<data {self.i} from {os.getpid()}>"


class Trainer(Actor):
    def __init__(self, dataloader: DataLoader) -> None:
        my_rank = context().actor_instance.rank
        self.dataloader = dataloader.slice(**my_rank)

    @endpoint
    def step(self, input: int | None = None) -> str:
        data = self.dataloader.example.call_one().get(timeout=20)
        return f"Step with data {data} and input = {input}"


def test_the_guides_dataloader_trainer_example_across_hosts(hosts2: object) -> None:
    trainer_procs = hosts2.spawn_procs(per_host={"gpus": 2})
    dataloaders = trainer_procs.spawn("dataloader", DataLoader)
    trainers = trainer_procs.spawn("dtrainers", Trainer, dataloaders)
    steps = trainers.step.call(7).get(timeout=30)
    pids = trainer_procs.spawn("pid", Pid).pid.call().get(timeout=20)
    for point, text in steps.items():  # each trainer used the data loader of its own point
        assert text == f"Step with data <data 1 from {pids.item(**point)}> and input = 7"
    trainer_procs.stop().get(timeout=20)


class Holder(Actor):
    """Gets meshes of every kind as arguments and uses them from its own process."""

    @endpoint
    def spawn_on(self, hosts: object) -> list[int]:
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        pids = [pid for _, pid in procs.spawn("pid", Pid).pid.call().get(timeout=20).items()]
        procs.stop().get(timeout=20)
        return pids

    @endpoint
    def call(self, actors: object) -> list[int]:
        return sorted(pid for _, pid in actors.pid.call().get(timeout=20).items())

    @endpoint
    def spawn_on_procs(self, procs: object) -> list[int]:
        return sorted(pid for _, pid in procs.spawn("mine", Pid).pid.call().get(timeout=20).items())

    @endpoint
    def try_shutdown(self, hosts: object) -> str:
        try:
            hosts.shutdown()
        except RuntimeError as e:
            return str(e)
        return "shut down"


def test_meshes_actors_and_hosts_pass_between_actors(hosts2: object) -> None:
    procs = hosts2.spawn_procs(per_host={"gpus": 1})
    actors = procs.spawn("pid", Pid)
    pids = sorted(pid for _, pid in actors.pid.call().get(timeout=20).items())
    holder = procs.slice(hosts=0).spawn("holder", Holder)  # an actor on host 0
    assert holder.call.call_one(actors).get(timeout=20) == pids
    assert len(set(holder.spawn_on_procs.call_one(procs).get(timeout=20)) & set(pids)) == 2
    # From host 0, spawn on the host mesh it was given: both hosts get a proc.
    assert len(holder.spawn_on.call_one(hosts2).get(timeout=40)) == 2
    local_holder = this_proc().spawn("local_holder", Holder)
    assert len(local_holder.spawn_on.call_one(hosts2.slice(hosts=1)).get(timeout=40)) == 1
    procs.stop().get(timeout=20)


REFERENCE = "cannot shut down `HostMesh` that is a reference instead of owned"


def test_sliced_and_unpickled_host_meshes_refuse_shutdown(hosts2: object) -> None:
    with pytest.raises(RuntimeError, match=REFERENCE):
        hosts2.slice(hosts=0).shutdown()
    with pytest.raises(RuntimeError, match=REFERENCE):
        pickle.loads(pickle.dumps(hosts2)).shutdown()
    holder = this_proc().spawn("holder", Holder)
    assert holder.try_shutdown.call_one(hosts2).get(timeout=20) == REFERENCE
    assert hosts2.spawn_procs().initialized.get(timeout=20) is True  # still usable
