"""Procs spawned on hosts run by host agents (``local:2``): the mesh's shape, every adverb,
slicing by host, ``this_host()`` inside an actor, and ``spawn_procs``'s options."""

from __future__ import annotations

import os

import psutil
import pytest
from actors import Counter, Pid

from monarch.actor import Actor, ActorError, context, endpoint, this_host

pytestmark = pytest.mark.timeout(60)


def _session_of(pid: int) -> int:
    """The host agent session that spawned the proc ``pid`` (its parent)."""
    return psutil.Process(pid).ppid()


class Where(Pid):
    @endpoint
    def rank(self) -> dict[str, int]:
        return dict(context().message_rank)

    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


def test_attach_returns_a_host_mesh_at_once_and_it_initializes(hosts2: object) -> None:
    assert dict(hosts2.extent) == {"hosts": 2}
    assert hosts2.initialized.get(timeout=20) is True


def test_spawn_procs_across_hosts_gives_hosts_by_per_host(hosts2: object) -> None:
    procs = hosts2.spawn_procs(per_host={"gpus": 2})
    assert dict(procs.extent) == {"hosts": 2, "gpus": 2}
    where = procs.spawn("where", Where)
    pids = where.pid.call().get(timeout=20)
    by_point = {tuple(point.values()): pid for point, pid in pids.items()}
    assert len(set(by_point.values())) == 4 and os.getpid() not in by_point.values()
    # The two procs of a host share one session (their parent), and the hosts differ.
    sessions = {h: {_session_of(by_point[(h, g)]) for g in range(2)} for h in range(2)}
    assert len(sessions[0]) == 1 and len(sessions[1]) == 1 and sessions[0] != sessions[1]
    assert where.rank.call().get(timeout=20).item(hosts=1, gpus=0) == {"hosts": 1, "gpus": 0}
    procs.stop().get(timeout=20)


def test_every_adverb_and_slicing_by_host(hosts2: object) -> None:
    procs = hosts2.spawn_procs(per_host={"gpus": 2})
    counters = procs.spawn("counters", Counter, 10)
    counters.incr.broadcast(1)
    counters.slice(hosts=1).incr.broadcast(5)
    values = counters.value.call().get(timeout=20)
    assert [values.item(hosts=h, gpus=g) for h in range(2) for g in range(2)] == [11, 11, 16, 16]
    assert counters.slice(hosts=1, gpus=0).value.call_one().get(timeout=20) == 16
    assert sorted(f.get(timeout=20) for f in counters.value.stream()) == [11, 11, 16, 16]
    assert counters.slice(hosts=0).value.choose().get(timeout=20) == 11
    host1 = procs.slice(hosts=1)
    assert dict(host1.extent) == {"gpus": 2}
    on_host1 = host1.spawn("more", Pid).pid.call().get(timeout=20)
    host1_pids = {pid for _, pid in counters.slice(hosts=1).pid.call().get(timeout=20).items()}
    assert {pid for _, pid in on_host1.items()} == host1_pids
    procs.stop().get(timeout=20)


class Spawner(Pid):
    """Spawns a proc on ``this_host()`` from inside an actor."""

    @endpoint
    def spawn_beside(self) -> tuple[int, int]:
        child = this_host().spawn_procs(per_host={"gpus": 1})
        pid = child.spawn("child", Pid).pid.call_one().get(timeout=20)
        parent = psutil.Process(pid).ppid()
        child.stop().get(timeout=20)
        return os.getppid(), parent


def test_this_host_inside_an_actor_is_that_actors_host(hosts2: object) -> None:
    procs = hosts2.spawn_procs()
    assert dict(procs.extent) == {"hosts": 2}
    spawner = procs.slice(hosts=1).spawn("spawner", Spawner)
    my_session, child_session = spawner.spawn_beside.call_one().get(timeout=30)
    assert my_session == child_session  # spawned by the same host's agent session
    procs.stop().get(timeout=20)


def _fail_bootstrap() -> None:
    raise ValueError("bootstrap refused")


def _set_marker() -> None:
    os.environ["BOOTSTRAPPED"] = "yes"


def test_env_bootstrap_and_preload_as_on_one_host(hosts2: object) -> None:
    procs = hosts2.spawn_procs(
        per_host={"gpus": 1}, env=lambda p: {"MY_RANK": str(p.rank)}, bootstrap=_set_marker, preload=["json"]
    )
    assert procs.initialized.get(timeout=30) is True
    where = procs.spawn("where", Where)
    assert sorted(where.env.call("MY_RANK").get(timeout=20).values()) == ["0", "1"]
    assert set(where.env.call("BOOTSTRAPPED").get(timeout=20).values()) == {"yes"}
    procs.stop().get(timeout=20)
    failing = hosts2.spawn_procs(per_host={"gpus": 1}, bootstrap=_fail_bootstrap)
    with pytest.raises(ActorError, match="bootstrap refused"):
        failing.initialized.get(timeout=30)
    failing.stop().get(timeout=20)


class AsyncSpawner(Actor):
    @endpoint
    async def spawn_here(self) -> None:
        this_host().spawn_procs(per_host={"gpus": 1})


def test_spawning_on_agent_hosts_from_an_async_endpoint_says_what_to_do(hosts2: object) -> None:
    procs = hosts2.slice(hosts=0).spawn_procs()
    with pytest.raises(ActorError, match="event loop thread"):
        procs.spawn("a", AsyncSpawner).spawn_here.call_one().get(timeout=20)
    procs.stop().get(timeout=20)


def test_a_spawn_the_host_refuses_raises_naming_the_host(hosts2: object) -> None:
    with pytest.raises(RuntimeError, match="spawning bad on the host of agent unix:.* failed: .*"):
        hosts2.spawn_procs(per_host={"gpus": 1}, env={"NOT_A_STRING": 1}, name="bad")  # type: ignore[dict-item]
    assert hosts2.spawn_procs(per_host={"gpus": 1}).initialized.get(timeout=20) is True
