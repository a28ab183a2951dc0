"""The supervision tree with real processes: no failure is silent, no call hangs.

Each test spawns its own worker processes, triggers one kind of failure and checks what the
caller, the owner of the failed mesh and the client's ``unhandled_fault_hook`` observe. The hook
is replaced with a recorder (the ``faults`` fixture, restored after the meshes are stopped);
what the default hook does to a client (exit code, KeyboardInterrupt, atexit) is in
test_fault_hook.py, where each scenario runs in a child interpreter.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import actors
import cloudpickle
import pytest
from helpers import wait_gone, wait_until

import monarch.actor
from monarch.actor import (
    Actor,
    ActorError,
    Channel,
    MeshFailure,
    Port,
    SupervisionError,
    context,
    endpoint,
    this_host,
    this_proc,
)

#: How long a failure may take to reach whoever must be told (the contract says "within a second").
DETECT_S = 1.0
#: Upper bound for anything a test waits on; far above the expected latency.
DEADLINE_S = 15.0
DESCENDANTS = "and all its descendants have failed"


# -- helpers ------------------------------------------------------------------------------------


def stays(pred: Callable[[], bool], window: float = 0.5, what: str = "condition") -> None:
    """Check that ``pred`` holds at every poll during ``window`` seconds (absence of an event)."""
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        assert pred(), f"{what} stopped holding"
        time.sleep(0.02)


class FaultRecorder:
    """Stands in for ``monarch.actor.unhandled_fault_hook``: records every fault it is given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.faults: list[tuple[float, MeshFailure]] = []

    def __call__(self, failure: MeshFailure) -> None:
        with self._lock:
            self.faults.append((time.monotonic(), failure))

    def of(self, mesh_name: str) -> list[MeshFailure]:
        with self._lock:
            return [f for _, f in self.faults if f.mesh_name == mesh_name]

    def times(self, mesh_name: str) -> list[float]:
        with self._lock:
            return [t for t, f in self.faults if f.mesh_name == mesh_name]

    def all(self) -> list[MeshFailure]:
        with self._lock:
            return [f for _, f in self.faults]

    def wait_for(self, mesh_name: str, count: int, timeout: float = DEADLINE_S) -> list[MeshFailure]:
        return wait_until(
            lambda: len(self.of(mesh_name)) >= count and self.of(mesh_name),
            timeout,
            f"{count} fault(s) of mesh {mesh_name!r} at the client hook (got {self.all()})",
        )


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultRecorder]:
    recorder = FaultRecorder()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", recorder)
    yield recorder


@pytest.fixture
def procs(faults: FaultRecorder) -> Iterator[Callable[[int], Any]]:
    """Factory for started proc meshes ``{gpus: n}``; every one is stopped before the hook is restored."""
    meshes: list[Any] = []

    def make(n: int) -> Any:
        pm = this_host().spawn_procs(per_host={"gpus": n})
        meshes.append(pm)
        # Wait until every process answers, so that timings below measure detection only.
        probe = pm.spawn("probe", Worker)
        probe.check.call().get(timeout=DEADLINE_S)
        probe.stop().get(timeout=DEADLINE_S)
        return pm

    yield make
    for pm in meshes:
        pm.stop().get(timeout=DEADLINE_S)


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    os.kill(pid, sig)


def assert_gone(pids: list[int], timeout: float = DEADLINE_S) -> None:
    assert wait_gone(pids, timeout) == [], f"processes {pids} did not exit within {timeout}s"


# -- actors ---------------------------------------------------------------------------------------


class Fatal(BaseException):
    """A BaseException that is not an Exception: it fails the actor instead of the call."""


class Worker(actors.Pid):
    def __init__(self, fail_init: bool = False) -> None:
        if fail_init:
            raise ValueError("This is an exception from __init__")

    @endpoint
    def check(self) -> str:
        return "this is a healthy check"

    @endpoint
    def rank(self) -> int:
        return context().actor_instance.rank.rank

    @endpoint
    def raise_exception(self, msg: str = "raised in a broadcast endpoint") -> None:
        raise RuntimeError(msg)

    @endpoint
    def raise_base(self, msg: str = "a fatal BaseException") -> None:
        raise Fatal(msg)

    @endpoint
    def raise_base_on(self, rank: int) -> str:
        if context().actor_instance.rank.rank == rank:
            raise Fatal(f"rank {rank} gave up")
        return "survived"

    @endpoint
    def exit_process(self, code: int = 3) -> None:
        sys.stdout.flush()
        os._exit(code)

    @endpoint
    def segfault(self) -> None:
        # To this thread: a signal sent to the process goes to its main thread, which may run
        # late, so the endpoint could return (and answer) before the process dies.
        signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)

    @endpoint
    def block(self, started: Port[int], only_rank: int | None = None) -> str:
        """Tell ``started`` which rank is now busy, then stay busy (until the process is killed)."""
        rank = context().actor_instance.rank.rank
        if only_rank is not None and rank != only_rank:
            return f"rank {rank} done"
        started.send(rank)
        threading.Event().wait(60)
        return "unblocked"

    @endpoint(explicit_response_port=True)
    def explicit_raise(self, port: Port[str], msg: str) -> None:
        raise ValueError(msg)

    @endpoint
    def abort(self, reason: str | None) -> str:
        context().actor_instance.abort(reason)
        return "aborted"

    @endpoint
    def stop_self(self) -> str:
        context().actor_instance.stop()
        return "stopping"


class Ballast(Worker):
    def __init__(self, ballast: str) -> None:
        super().__init__()
        self.size = len(ballast)


Counter = actors.Counter


class WithCleanup(Actor):
    def __init__(self, counter: Any) -> None:
        self.counter = counter

    @endpoint
    def check(self) -> str:
        return "alive"

    @endpoint
    def stop_self(self) -> str:
        context().actor_instance.stop()
        return "stopping"

    @endpoint
    def bump(self) -> None:
        self.counter.incr.call_one().get(timeout=10)

    def __cleanup__(self, exc: Any) -> None:
        self.counter.incr.call_one().get(timeout=10)


class Wrapper(Actor):
    """Owns two meshes whose actors have a ``__cleanup__``."""

    def __init__(self, counter: Any, procs: Any) -> None:
        self.inner = [procs.spawn(f"inner_{i}", WithCleanup, counter) for i in range(2)]

    @endpoint
    def check(self) -> list[str]:
        return [m.check.call_one().get(timeout=10) for m in self.inner]


def _failure_record(failure: MeshFailure) -> dict[str, Any]:
    # MeshFailure is not picklable: owners hand back what the tests look at.
    return {
        "mesh_name": failure.mesh_name,
        "ranks": list(failure.crashed_ranks),
        "report": failure.report(),
        "str": str(failure),
        "at": time.time(),
    }


class Owner(Actor):
    """Spawns a child mesh and supervises it; ``verdict`` is what ``__supervise__`` does."""

    def __init__(self, verdict: str = "handled") -> None:
        self.verdict = verdict
        self.failures: list[dict[str, Any]] = []
        self.children: Any = None
        self.own_procs: Any = None

    @endpoint
    def spawn_children(
        self, procs: Any, name: str, cls: type = Worker, args: tuple = (), ready: bool = True
    ) -> Any:
        self.children = procs.spawn(name, cls, *args)
        if ready:
            # Our own messages follow our spawn; a third party's may overtake it (see
            # test_mesh_reference_usable_right_after_spawn), so wait until every rank exists.
            self.children.check.call().get(timeout=10)
        return self.children

    @endpoint
    def spawn_heavy(self, procs: Any, name: str, megabytes: int) -> Any:
        """Spawn with a large constructor argument and hand the mesh out at once.

        A str is pickled inside the message itself (large bytes would travel out of band),
        so the spawn message really takes a while to cross the socket."""
        self.children = procs.spawn(name, Ballast, "x" * (megabytes << 20))
        return self.children

    @endpoint
    def spawn_own_procs(self, n: int, name: str) -> Any:
        self.own_procs = this_host().spawn_procs(per_host={"gpus": n})
        self.children = self.own_procs.spawn(name, Worker)
        self.children.check.call().get(timeout=10)
        return self.children

    @endpoint
    def stop_own_procs(self) -> None:
        self.own_procs.stop().get(timeout=10)

    @endpoint
    def break_children(self) -> None:
        self.children.raise_base.broadcast()

    @endpoint
    def child_pids(self) -> list[int]:
        return list(self.children.pid.call().get(timeout=10).values())

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return list(self.failures)

    @endpoint
    def fail_own_endpoint(self) -> None:
        raise ValueError("the owner's own endpoint raised")

    @endpoint
    def check(self) -> str:
        return "owner alive"

    @endpoint
    def call_children(self, endpoint_name: str) -> str:
        try:
            getattr(self.children, endpoint_name).call().get(timeout=10)
        except SupervisionError as e:
            return f"SupervisionError: {e}"
        return "returned"

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(_failure_record(failure))
        if self.verdict == "raise":
            raise RuntimeError("the supervisor gave up on purpose")
        if self.verdict == "raise_base":
            raise Fatal("the supervisor raised a BaseException")
        return self.verdict == "handled"


class AsyncOwner(Actor):
    """An async actor whose ``async def __supervise__`` awaits before deciding."""

    def __init__(self, verdict: str = "handled") -> None:
        self.verdict = verdict
        self.failures: list[dict[str, Any]] = []
        self.children: Any = None
        self.supervise_loop: tuple[int, int] | None = None

    @endpoint
    async def spawn_children(self, procs: Any, name: str) -> Any:
        self.children = procs.spawn(name, Worker)
        await self.children.check.call()
        return self.children

    @endpoint
    async def endpoint_loop(self) -> tuple[int, int]:
        return id(asyncio.get_running_loop()), threading.get_ident()

    @endpoint
    async def supervised_on(self) -> tuple[int, int] | None:
        return self.supervise_loop

    @endpoint
    async def seen(self) -> list[dict[str, Any]]:
        return list(self.failures)

    async def __supervise__(self, failure: MeshFailure) -> bool:
        self.supervise_loop = (id(asyncio.get_running_loop()), threading.get_ident())
        await asyncio.sleep(0)  # it really runs as a coroutine on the loop
        self.failures.append(_failure_record(failure))
        return self.verdict == "handled"


class SyncActorAsyncSupervise(Actor):
    """Sync endpoints, ``async def __supervise__``: the guide allows either form."""

    def __init__(self) -> None:
        self.children: Any = None
        self.calls = 0

    @endpoint
    def spawn_children(self, procs: Any, name: str) -> Any:
        self.children = procs.spawn(name, Worker)
        self.children.check.call().get(timeout=10)
        return self.children

    @endpoint
    def calls_seen(self) -> int:
        return self.calls

    async def __supervise__(self, failure: MeshFailure) -> bool:
        self.calls += 1
        await asyncio.sleep(0)
        return False


class Holder(Actor):
    """Holds a reference to a mesh it did not spawn; must never be asked to supervise it."""

    def __init__(self) -> None:
        self.ref: Any = None
        self.failures: list[dict[str, Any]] = []

    @endpoint
    def hold(self, mesh: Any) -> None:
        self.ref = mesh

    @endpoint
    def break_it(self) -> None:
        self.ref.raise_base.broadcast()

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return list(self.failures)

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(_failure_record(failure))
        return True


# -- 2. every failure source becomes a MeshFailure within a second ---------------------------------


def _trigger_broadcast_exception(mesh: Any) -> None:
    mesh.raise_exception.broadcast("raised in a broadcast endpoint")


def _trigger_base_exception(mesh: Any) -> None:
    mesh.raise_base.broadcast("a fatal BaseException")


def _trigger_os_exit(mesh: Any) -> None:
    mesh.exit_process.broadcast(3)


def _trigger_segfault(mesh: Any) -> None:
    mesh.segfault.broadcast()


def _trigger_sigkill(mesh: Any) -> None:
    kill(mesh.pid.call_one().get(timeout=DEADLINE_S))


def _trigger_explicit_port(mesh: Any) -> None:
    mesh.explicit_raise.broadcast("raised past an explicit response port")


FAILURE_SOURCES = {
    "broadcast-exception": (_trigger_broadcast_exception, "RuntimeError: raised in a broadcast endpoint"),
    "base-exception": (_trigger_base_exception, "Fatal: a fatal BaseException"),
    "os-exit": (_trigger_os_exit, "exited with code 3"),
    "sigsegv": (_trigger_segfault, "SIGSEGV"),
    "sigkill": (_trigger_sigkill, "SIGKILL"),
    "explicit-port-exception": (_trigger_explicit_port, "ValueError: raised past an explicit response port"),
}


@pytest.mark.parametrize("source", list(FAILURE_SOURCES))
def test_failure_source_reaches_client_hook_within_a_second(
    source: str, procs: Any, faults: FaultRecorder
) -> None:
    trigger, cause = FAILURE_SOURCES[source]
    pm = procs(1)
    name = f"victim_{source.replace('-', '_')}"
    mesh = pm.spawn(name, Worker)
    assert mesh.check.call_one().get(timeout=DEADLINE_S) == "this is a healthy check"

    start = time.monotonic()
    trigger(mesh)
    (failure,) = faults.wait_for(name, 1)
    latency = faults.times(name)[0] - start
    assert latency < DETECT_S, f"{source} took {latency:.2f}s to reach the client"

    assert isinstance(failure, MeshFailure)
    assert failure.mesh_name == name
    assert failure.crashed_ranks == [0]
    report = failure.report()
    assert DESCENDANTS in report and cause in report, report
    assert str(failure).startswith(f"MeshFailure(mesh_name={name}, crashed_ranks=[0], event=")
    with pytest.raises(TypeError):
        cloudpickle.dumps(failure)
    # The mesh is now known failed: a call fails at once and names the cause.
    with pytest.raises(SupervisionError, match=f"{name}.check") as err:
        mesh.check.call_one().get(timeout=DETECT_S)
    assert cause in str(err.value)
    stays(lambda: len(faults.of(name)) == 1, what="exactly one fault")


def test_init_exception_reported_once_per_rank(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    start = time.monotonic()
    mesh = pm.spawn("bad_init", Worker, fail_init=True)  # does not raise here
    got = faults.wait_for("bad_init", 2)
    assert max(faults.times("bad_init")) - start < DETECT_S
    assert sorted(r for f in got for r in f.crashed_ranks) == [0, 1]
    for f in got:
        assert "bad_init" in str(f) and "This is an exception from __init__" in str(f)
        assert "__init__ raised" in f.report()
    with pytest.raises(SupervisionError, match="This is an exception from __init__"):
        mesh.check.call().get(timeout=DETECT_S)
    pm.stop().get(timeout=DEADLINE_S)
    # The processes exiting afterwards is not a second failure of the same ranks.
    assert len(faults.of("bad_init")) == 2


def test_endpoint_exception_with_a_caller_is_not_a_fault(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(1)
    mesh = pm.spawn("plain_error", Worker)
    with pytest.raises(ActorError, match="raised for the caller"):
        mesh.raise_exception.call_one("raised for the caller").get(timeout=DEADLINE_S)
    assert mesh.check.call_one().get(timeout=DEADLINE_S) == "this is a healthy check"
    assert faults.all() == []


# -- 4. callers never hang ---------------------------------------------------------------------


def test_pending_call_on_killed_proc_raises_naming_mesh_endpoint_and_signal(
    procs: Any, faults: FaultRecorder
) -> None:
    pm = procs(1)
    mesh = pm.spawn("sleeper", Worker)
    pid = mesh.pid.call_one().get(timeout=DEADLINE_S)
    started, busy = Channel[int].open()
    pending = mesh.block.call_one(started)
    assert busy.recv().get(timeout=DEADLINE_S) == 0  # the call is now running on the actor
    assert not pending.done()
    kill(pid)
    t0 = time.monotonic()
    with pytest.raises(SupervisionError) as err:
        pending.get(timeout=DEADLINE_S)
    assert time.monotonic() - t0 < DETECT_S
    assert isinstance(err.value, RuntimeError)
    text = str(err.value)
    assert "sleeper" in text and "block" in text and "SIGKILL" in text, text
    faults.wait_for("sleeper", 1)


def test_pending_call_stream_and_gather_fail_when_one_rank_dies(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    mesh = pm.spawn("half", Worker)
    pids = list(mesh.pid.call().get(timeout=DEADLINE_S).values())
    started, busy = Channel[int].open()
    gathered = mesh.block.call(started, 1)
    streamed = list(mesh.block.stream(started, 1))
    assert sorted([busy.recv().get(timeout=DEADLINE_S)]) == [1]
    # Rank 0 answers at once; rank 1 is stuck until its process is killed.
    assert streamed[0].get(timeout=DEADLINE_S) == "rank 0 done"
    kill(pids[1])
    with pytest.raises(SupervisionError, match="half.block"):
        gathered.get(timeout=DEADLINE_S)
    with pytest.raises(SupervisionError, match="SIGKILL"):
        streamed[1].get(timeout=DEADLINE_S)
    (f,) = faults.wait_for("half", 1)
    assert f.crashed_ranks == [1]
    # The surviving rank still answers; the dead one fails fast, alone or inside a slice.
    assert mesh.slice(gpus=0).check.call_one().get(timeout=DEADLINE_S) == "this is a healthy check"
    for target in (mesh, mesh.slice(gpus=1), mesh.slice(gpus=slice(0, 2))):
        t0 = time.monotonic()
        with pytest.raises(SupervisionError, match="half.check"):
            target.check.call().get(timeout=DEADLINE_S)
        assert time.monotonic() - t0 < DETECT_S


def test_calls_queued_behind_a_failing_message_raise(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(1)
    mesh = pm.spawn("queued", Worker)
    mesh.raise_base.broadcast("dies before the next message")
    queued = [mesh.check.call_one() for _ in range(3)]
    for fut in queued:
        try:
            assert fut.get(timeout=DEADLINE_S) == "this is a healthy check"
        except SupervisionError as e:
            assert "dies before the next message" in str(e)
    faults.wait_for("queued", 1)
    with pytest.raises(SupervisionError, match="dies before the next message"):
        mesh.check.call_one().get(timeout=DETECT_S)


def test_explicit_port_caller_gets_supervision_error(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(1)
    mesh = pm.spawn("explicit", Worker)
    with pytest.raises(SupervisionError, match="nobody catches this"):
        mesh.explicit_raise.call_one("nobody catches this").get(timeout=DEADLINE_S)
    (f,) = faults.wait_for("explicit", 1)
    assert "ValueError: nobody catches this" in f.report()


def test_partial_failure_spares_other_slices_and_meshes(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(4)
    mesh = pm.spawn("four", Worker)
    other = pm.spawn("neighbour", Worker)
    values = mesh.raise_base_on.call(3)
    with pytest.raises(SupervisionError, match=DESCENDANTS):
        values.get(timeout=DEADLINE_S)
    (f,) = faults.wait_for("four", 1)
    assert f.crashed_ranks == [3] and "rank 3 gave up" in f.report()

    for bad in (mesh, mesh.slice(gpus=3), mesh.slice(gpus=slice(2, 4))):
        with pytest.raises(SupervisionError, match=f"four.check.*{DESCENDANTS}"):
            bad.check.call().get(timeout=DETECT_S)
    for good in (mesh.slice(gpus=2), mesh.slice(gpus=slice(0, 3))):
        assert set(good.check.call().get(timeout=DEADLINE_S).values()) == {"this is a healthy check"}
    assert set(other.check.call().get(timeout=DEADLINE_S).values()) == {"this is a healthy check"}
    assert faults.of("neighbour") == []


def test_other_meshes_on_the_killed_proc_fail_too(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    a = pm.spawn("on_a", Worker)
    b = pm.spawn("on_b", Worker)
    pid1 = a.slice(gpus=1).pid.call_one().get(timeout=DEADLINE_S)
    kill(pid1)
    for name in ("on_a", "on_b"):
        (f,) = faults.wait_for(name, 1)
        assert f.crashed_ranks == [1] and "SIGKILL" in f.report()
    for m in (a, b):
        with pytest.raises(SupervisionError, match="SIGKILL"):
            m.check.call().get(timeout=DETECT_S)
        assert m.slice(gpus=0).check.call_one().get(timeout=DEADLINE_S) == "this is a healthy check"


def test_spawning_on_a_dead_proc_is_reported(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(1)
    first = pm.spawn("before_death", Worker)
    kill(first.pid.call_one().get(timeout=DEADLINE_S))
    faults.wait_for("before_death", 1)
    late = pm.spawn("after_death", Worker)
    (f,) = faults.wait_for("after_death", 1)
    assert "SIGKILL" in f.report()
    with pytest.raises(SupervisionError, match="after_death.check"):
        late.check.call_one().get(timeout=DETECT_S)


# -- 1 and 3. ownership and __supervise__ ------------------------------------------------------------


def _seen(actor: Any, count: int, what: str) -> list[dict[str, Any]]:
    return wait_until(
        lambda: (lambda s: len(s) >= count and s)(actor.seen.call_one().get(timeout=DEADLINE_S)), what=what
    )


def test_failures_go_to_the_owner_not_to_reference_holders(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    owner = pm.slice(gpus=0).spawn("owner", Owner, "handled")
    holder = pm.slice(gpus=1).spawn("holder", Holder)
    children = owner.spawn_children.call_one(pm, "children").get(timeout=DEADLINE_S)
    assert set(children.check.call().get(timeout=DEADLINE_S).values()) == {"this is a healthy check"}
    holder.hold.call_one(children.slice(gpus=1)).get(timeout=DEADLINE_S)

    start = time.time()
    holder.break_it.call_one().get(timeout=DEADLINE_S)  # the holder breaks rank 1 through its slice
    (seen,) = _seen(owner, 1, "the owner to be told")
    assert seen["at"] - start < DETECT_S
    assert seen["mesh_name"] == "children" and seen["ranks"] == [1]
    assert "MeshFailure" in seen["str"] and "children" in seen["str"]
    assert "Fatal: a fatal BaseException" in seen["report"]

    # A reference held by the client fails fast on the failed rank, works on the others.
    with pytest.raises(SupervisionError, match=DESCENDANTS):
        children.check.call().get(timeout=DEADLINE_S)
    assert children.slice(gpus=0).check.call_one().get(timeout=DEADLINE_S) == "this is a healthy check"
    # Handled by the owner: neither the holder nor the client is involved, the owner lives on.
    assert holder.seen.call_one().get(timeout=DEADLINE_S) == []
    assert owner.check.call_one().get(timeout=DEADLINE_S) == "owner alive"
    assert faults.all() == []
    # __supervise__ is only for meshes the actor owns, not for its own endpoint errors.
    with pytest.raises(ActorError):
        owner.fail_own_endpoint.call_one().get(timeout=DEADLINE_S)
    assert len(owner.seen.call_one().get(timeout=DEADLINE_S)) == 1


def test_mesh_reference_usable_right_after_spawn(procs: Any, faults: FaultRecorder) -> None:
    ctl = procs(1)
    pm = procs(1)
    owner = ctl.spawn("eager_owner", Owner, "handled")
    children = owner.spawn_heavy.call_one(pm, "handed_out", 64).get(timeout=DEADLINE_S)
    assert children.check.call_one().get(timeout=DEADLINE_S) == "this is a healthy check"


def test_supervise_called_once_per_failed_rank(procs: Any, faults: FaultRecorder) -> None:
    ctl = procs(1)
    work = procs(4)
    owner = ctl.spawn("owner4", Owner, "handled")
    children = owner.spawn_children.call_one(work, "all_four").get(timeout=DEADLINE_S)
    pids = owner.child_pids.call_one().get(timeout=DEADLINE_S)
    owner.break_children.call_one().get(timeout=DEADLINE_S)
    seen = _seen(owner, 4, "four failures")
    assert sorted(r for s in seen for r in s["ranks"]) == [0, 1, 2, 3]
    assert all(len(s["ranks"]) == 1 and s["mesh_name"] == "all_four" for s in seen)
    # The processes dying afterwards does not re-report ranks that already failed.
    for pid in pids:
        kill(pid)
    assert_gone(pids)
    with pytest.raises(SupervisionError):
        children.check.call().get(timeout=DEADLINE_S)
    stays(lambda: len(owner.seen.call_one().get(timeout=DEADLINE_S)) == 4, what="four failures only")
    assert faults.all() == []


def test_sigkilled_child_reaches_owner_actor_in_another_process(procs: Any, faults: FaultRecorder) -> None:
    ctl = procs(1)
    work = procs(2)
    owner = ctl.spawn("remote_owner", Owner, "handled")
    owner.spawn_children.call_one(work, "remote_children").get(timeout=DEADLINE_S)
    pids = owner.child_pids.call_one().get(timeout=DEADLINE_S)
    start = time.time()
    kill(pids[0])
    (seen,) = _seen(owner, 1, "the owner to hear of the kill")
    assert seen["at"] - start < DETECT_S
    assert seen["mesh_name"] == "remote_children" and seen["ranks"] == [0]
    # The owner's own calls to the dead rank fail instead of hanging.
    assert owner.call_children.call_one("check").get(timeout=DEADLINE_S).startswith("SupervisionError")
    assert faults.all() == []


def test_actor_that_spawns_procs_owns_them(procs: Any, faults: FaultRecorder) -> None:
    ctl = procs(1)
    owner = ctl.spawn("proc_owner", Owner, "handled")
    owner.spawn_own_procs.call_one(2, "grandchildren").get(timeout=DEADLINE_S)
    pids = owner.child_pids.call_one().get(timeout=DEADLINE_S)
    try:
        kill(pids[1])
        (seen,) = _seen(owner, 1, "the owner of the procs to be told")
        assert seen["mesh_name"] == "grandchildren" and seen["ranks"] == [1]
        assert "SIGKILL" in seen["report"]
        assert faults.all() == []
    finally:
        owner.stop_own_procs.call_one().get(timeout=DEADLINE_S)
    assert_gone(pids)


def test_unhandled_failure_propagates_to_the_owners_owner(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    owner = pm.slice(gpus=0).spawn("lax_owner", Owner, "propagate")
    children = owner.spawn_children.call_one(pm, "error_actor").get(timeout=DEADLINE_S)
    children.raise_base.broadcast("the child failed first")
    (f,) = faults.wait_for("lax_owner", 1)
    assert f.crashed_ranks == [0]
    report = f.report()
    assert "lax_owner" in report and DESCENDANTS in report
    assert "the child failed first" in report and "error_actor" in report
    # The owner has failed: calls on it fail fast; its one rank is reported once in all.
    with pytest.raises(SupervisionError, match=f"The actor .*lax_owner.* {DESCENDANTS}"):
        owner.check.call_one().get(timeout=DEADLINE_S)
    stays(lambda: len(faults.of("lax_owner")) == 1, what="a single report of the owner")
    assert faults.of("error_actor") == []


def test_three_level_tree_grandparent_handles(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    grand = pm.slice(gpus=0).spawn("grandparent", Owner, "handled")
    parent = grand.spawn_children.call_one(pm.slice(gpus=1), "parent", Owner, ("propagate",)).get(
        timeout=DEADLINE_S
    )
    children = parent.spawn_children.call_one(pm, "leaf").get(timeout=DEADLINE_S)
    children.slice(gpus=0).raise_base.broadcast("a leaf broke")
    (seen,) = _seen(grand, 1, "the grandparent to be told")
    assert seen["mesh_name"] == "parent"
    assert seen["ranks"] == [0] and "a leaf broke" in seen["report"]
    with pytest.raises(SupervisionError):
        parent.check.call_one().get(timeout=DEADLINE_S)
    assert grand.check.call_one().get(timeout=DEADLINE_S) == "owner alive"
    assert faults.all() == []


def test_raising_in_supervise_chains_a_new_failure(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    owner = pm.slice(gpus=0).spawn("strict_owner", Owner, "raise")
    children = owner.spawn_children.call_one(pm.slice(gpus=1), "doomed").get(timeout=DEADLINE_S)
    children.raise_base.broadcast("original failure")
    (f,) = faults.wait_for("strict_owner", 1)
    report = f.report()
    assert "the supervisor gave up on purpose" in report
    assert "This error occurred while handling another failure" in report
    assert "original failure" in report
    with pytest.raises(SupervisionError, match="the supervisor gave up on purpose"):
        owner.check.call_one().get(timeout=DEADLINE_S)


def test_base_exception_in_supervise_is_reported_not_silent(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    owner = pm.slice(gpus=0).spawn("panicky_owner", Owner, "raise_base")
    children = owner.spawn_children.call_one(pm.slice(gpus=1), "panicky_child").get(timeout=DEADLINE_S)
    children.raise_base.broadcast("child failure")
    (f,) = faults.wait_for("panicky_owner", 1)
    assert "the supervisor raised a BaseException" in f.report()
    assert "This error occurred while handling another failure" in f.report()
    with pytest.raises(SupervisionError, match="panicky_owner"):
        owner.check.call_one().get(timeout=DEADLINE_S)


@pytest.mark.parametrize("verdict", ["handled", "propagate"])
def test_async_supervise_runs_on_the_actor_loop(verdict: str, procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    owner = pm.slice(gpus=0).spawn(f"async_owner_{verdict}", AsyncOwner, verdict)
    endpoint_loop = owner.endpoint_loop.call_one().get(timeout=DEADLINE_S)
    children = owner.spawn_children.call_one(pm.slice(gpus=1), "async_child").get(timeout=DEADLINE_S)
    children.raise_base.broadcast("async child failure")
    if verdict == "handled":
        (seen,) = _seen(owner, 1, "the async supervisor")
        assert seen["mesh_name"] == "async_child" and "async child failure" in seen["report"]
        assert owner.supervised_on.call_one().get(timeout=DEADLINE_S) == endpoint_loop
        assert faults.all() == []
    else:
        (f,) = faults.wait_for(f"async_owner_{verdict}", 1)
        assert "async child failure" in f.report()


def test_async_supervise_on_sync_actor_propagates_falsy(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(2)
    owner = pm.slice(gpus=0).spawn("mixed_owner", SyncActorAsyncSupervise)
    children = owner.spawn_children.call_one(pm.slice(gpus=1), "mixed_child").get(timeout=DEADLINE_S)
    children.raise_base.broadcast("mixed child failure")
    # The coroutine is awaited (not taken as a truthy object): False propagates to the client.
    (f,) = faults.wait_for("mixed_owner", 1)
    assert "a mesh it owns failed and was not handled" in f.report() and "mixed child failure" in f.report()
    with pytest.raises(SupervisionError, match="mixed_owner"):
        owner.calls_seen.call_one().get(timeout=DEADLINE_S)


# -- 5. lifecycle ---------------------------------------------------------------------------------


def test_proc_mesh_stop_runs_cleanup(faults: FaultRecorder) -> None:
    counter = this_proc().spawn("proc_stop_counter", Counter)
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = pm.spawn("cleaned_by_proc_stop", WithCleanup, counter)
        assert set(mesh.check.call().get(timeout=DEADLINE_S).values()) == {"alive"}
        pm.stop().get(timeout=DEADLINE_S)
        wait_until(
            lambda: counter.value.call_one().get(timeout=DEADLINE_S) == 2, what="both __cleanup__ calls"
        )
        with pytest.raises(SupervisionError):
            mesh.check.call().get(timeout=DEADLINE_S)
        with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
            pm.spawn("too_late", Worker).initialized.get(timeout=DEADLINE_S)
        assert faults.all() == []
    finally:
        pm.stop().get(timeout=DEADLINE_S)
        counter.stop().get(timeout=DEADLINE_S)


def test_proc_mesh_stop_after_procs_died_and_respawn(faults: FaultRecorder) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = pm.spawn("to_be_killed", Worker)
        pids = list(mesh.pid.call().get(timeout=DEADLINE_S).values())
        for pid in pids:
            kill(pid)
        faults.wait_for("to_be_killed", 2)
        t0 = time.monotonic()
        pm.stop().get(timeout=DEADLINE_S)
        assert time.monotonic() - t0 < 5.0
        with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
            pm.spawn("too_late", Worker)
    finally:
        pm.stop().get(timeout=DEADLINE_S)
    assert_gone(pids)
    # A fresh proc mesh on the same host works after the failure.
    again = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        fresh = again.spawn("respawned", Worker)
        assert set(fresh.check.call().get(timeout=DEADLINE_S).values()) == {"this is a healthy check"}
    finally:
        again.stop().get(timeout=DEADLINE_S)
    assert len(faults.of("to_be_killed")) == 2 and faults.of("respawned") == []


def test_instance_stop_stops_only_that_actor(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(1)
    counter = this_proc().spawn("self_stop_counter", Counter)
    try:
        mesh = pm.spawn("self_stopper", WithCleanup, counter)
        assert mesh.stop_self.call_one().get(timeout=DEADLINE_S) == "stopping"
        wait_until(
            lambda: counter.value.call_one().get(timeout=DEADLINE_S) == 1,
            what="__cleanup__ after Instance.stop()",
        )

        def call_fails() -> bool:
            try:
                mesh.check.call_one().get(timeout=DEADLINE_S)
            except SupervisionError:
                return True
            return False

        assert call_fails()
        assert faults.all() == []
    finally:
        counter.stop().get(timeout=DEADLINE_S)


@pytest.mark.parametrize(
    "reason, expected", [("the data is corrupt", "the data is corrupt"), (None, "no reason provided")]
)
def test_abort_reports_the_reason(
    reason: str | None, expected: str, procs: Any, faults: FaultRecorder
) -> None:
    pm = procs(1)
    mesh = pm.spawn("aborter", Worker)
    mesh.abort.call_one(reason).get(timeout=DEADLINE_S)
    (f,) = faults.wait_for("aborter", 1)
    assert expected in f.report() and DESCENDANTS in f.report()
    with pytest.raises(SupervisionError, match=expected):
        mesh.check.call_one().get(timeout=DETECT_S)


def test_stopping_an_owner_stops_the_meshes_it_owns(procs: Any, faults: FaultRecorder) -> None:
    pm = procs(1)
    counter = this_proc().spawn("wrapper_counter", Counter)
    try:
        wrapper = pm.spawn("wrapper", Wrapper, counter, pm)
        assert wrapper.check.call_one().get(timeout=DEADLINE_S) == ["alive", "alive"]
        wrapper.stop().get(timeout=DEADLINE_S)
        wait_until(
            lambda: counter.value.call_one().get(timeout=DEADLINE_S) == 2,
            timeout=3,
            what="both owned meshes' __cleanup__",
        )
    finally:
        counter.stop().get(timeout=DEADLINE_S)


def test_rank_reported_once_even_when_its_process_dies_later(faults: FaultRecorder) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mesh = pm.spawn("fails_then_dies", Worker)
        pid = mesh.pid.call_one().get(timeout=DEADLINE_S)
        mesh.raise_base.broadcast("first the actor fails")
        faults.wait_for("fails_then_dies", 1)
        kill(pid)
        # stop() resolves only after the exit has been processed by the supervision layer.
        pm.stop().get(timeout=DEADLINE_S)
        (f,) = faults.of("fails_then_dies")
        assert "first the actor fails" in f.report()
    finally:
        pm.stop().get(timeout=DEADLINE_S)
