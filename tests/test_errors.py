"""Errors at the call site (TypeError, ValueError, pickling) and from remote endpoints (ActorError)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from monarch.actor import Actor, ActorError, endpoint, this_proc

REPO = Path(__file__).resolve().parents[1]


class Boom(Actor):
    def __init__(self) -> None:
        self.v = 0

    @endpoint
    def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @endpoint
    def chained(self) -> None:
        try:
            raise KeyError("Inner")
        except KeyError as e:
            raise RuntimeError("Outer") from e

    @endpoint
    def implicit(self) -> None:
        try:
            raise KeyError("first problem")
        except KeyError:
            raise RuntimeError("second problem")  # noqa: B904 - implicit context on purpose

    @endpoint
    def incr(self, by: int) -> int:
        self.v += by
        return self.v

    @endpoint
    def value(self) -> int:
        return self.v

    @endpoint
    def give_lock(self):
        return threading.Lock()

    @endpoint
    def give_refusing(self):
        return RefusesPickling()

    @endpoint
    def take(self, obj) -> str:
        return type(obj).__name__

    def not_an_endpoint(self) -> int:
        return 1


class AsyncBoom(Actor):
    @endpoint
    async def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @endpoint
    async def ok(self) -> str:
        return "ok"


class Relay(Actor):
    @endpoint
    async def relay(self, target, msg: str) -> None:
        await target.fail.call_one(msg)


class NeedsArgs(Actor):
    def __init__(self, a: int, *, b: str) -> None:
        self.a = a


class NotAnActor:
    pass


class TwoArgError(Exception):
    """An exception whose constructor does not accept its own ``args`` back."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


class LockedError(Exception):
    """Pickling this exception fails: it holds a lock."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.lock = threading.Lock()


class RaisesCustom(Actor):
    @endpoint
    def fail(self) -> None:
        raise TwoArgError("E42", "custom detail")

    @endpoint
    def fail_unpicklable(self) -> None:
        raise LockedError("holding a lock")

    @endpoint
    def kw_only(self, a: int, *, k: int = 1) -> tuple:
        return (a, k)

    @endpoint
    def ok(self) -> str:
        return "ok"


class RefusesPickling:
    def __reduce__(self):
        raise ValueError("this object refuses to be pickled")


def _explode_on_load():
    raise RuntimeError("cannot rebuild me here")


class UnpicklableOnReceiver:
    def __reduce__(self):
        return (_explode_on_load, ())


@pytest.fixture
def boom(procs1):
    return procs1.spawn("boom", Boom)


def test_endpoint_exception_becomes_actor_error(boom):
    with pytest.raises(ActorError, match="This is a test exception") as ei:
        boom.fail.call_one("This is a test exception").get(timeout=10)
    err = ei.value
    assert type(err.exception) is ValueError
    assert str(err.exception) == "This is a test exception"
    assert err.message == "Actor call boom.fail failed."
    assert "Traceback of where the remote call failed (most recent call last):" in err.exception_formatted
    assert ", in fail" in str(err)  # the remote frame is part of the text
    # The actor survives.
    assert boom.incr.call_one(1).get(timeout=10) == 1


def test_endpoint_exception_on_all_ranks_of_call(procs2):
    for cls in (Boom, AsyncBoom):
        m = procs2.spawn("m", cls)
        with pytest.raises(ActorError, match="on every rank") as ei:
            m.fail.call("on every rank").get(timeout=10)
        assert isinstance(ei.value.exception, ValueError)
    assert m.ok.call().get(timeout=10).values() == ["ok", "ok"]


def test_async_endpoint_exception(procs1):
    m = procs1.spawn("aboom", AsyncBoom)
    with pytest.raises(ActorError, match="async failure"):
        m.fail.call_one("async failure").get(timeout=10)
    assert m.ok.call_one().get(timeout=10) == "ok"


def test_chained_cause_in_remote_traceback(boom):
    with pytest.raises(ActorError) as ei:
        boom.chained.call_one().get(timeout=10)
    text = str(ei.value)
    assert "Inner" in text and "Outer" in text
    assert "The above exception was the direct cause of the following exception" in text
    assert isinstance(ei.value.exception, RuntimeError)


def test_implicit_context_in_remote_traceback(boom):
    with pytest.raises(ActorError) as ei:
        boom.implicit.call_one().get(timeout=10)
    text = str(ei.value)
    assert "first problem" in text and "second problem" in text
    assert "During handling of the above exception, another exception occurred" in text


def test_nested_actor_error_carries_inner_message(procs1, boom):
    relay = procs1.spawn("relay", Relay)
    with pytest.raises(ActorError, match="deep down"):
        relay.relay.call_one(boom, "deep down").get(timeout=10)


def test_calling_non_endpoint_method(boom):
    with pytest.raises(RuntimeError, match="is not annotated as an endpoint"):
        boom.not_an_endpoint.call_one()
    with pytest.raises(RuntimeError, match="is not annotated as an endpoint"):
        boom.not_an_endpoint.call()
    assert boom.value.call_one().get(timeout=10) == 0


def test_unknown_attribute(boom):
    with pytest.raises(AttributeError):
        boom.no_such_thing  # noqa: B018
    assert boom.value.call_one().get(timeout=10) == 0


def test_wrong_endpoint_arguments_raise_at_call_site(boom):
    with pytest.raises(TypeError):
        boom.incr.call_one()
    with pytest.raises(TypeError):
        boom.incr.call_one(1, 2)
    with pytest.raises(TypeError):
        boom.incr.broadcast(nope=3)
    with pytest.raises(TypeError):
        boom.incr.call(1, by=2)
    # Nothing was delivered: the state is untouched.
    assert boom.value.call_one().get(timeout=10) == 0


def test_wrong_constructor_arguments_raise_at_spawn():
    with pytest.raises(TypeError):
        this_proc().spawn("needs", NeedsArgs)
    with pytest.raises(TypeError):
        this_proc().spawn("needs", NeedsArgs, 1, 2)
    with pytest.raises(TypeError):
        this_proc().spawn("needs", Boom, 1)


def test_spawning_a_non_actor_class():
    with pytest.raises(ValueError, match="must subclass"):
        this_proc().spawn("nope", NotAnActor)


def test_unpicklable_argument_fails_at_call_site(boom):
    with pytest.raises(Exception, match="pickle") as ei:
        boom.take.call_one(threading.Lock())
    notes = "\n".join(getattr(ei.value, "__notes__", []))
    assert "arguments of a call to boom.take: nothing was sent" in notes
    assert "HINT: an endpoint's arguments must be picklable" in notes
    with socket.socket() as s:
        with pytest.raises(Exception, match="pickle|socket"):
            boom.take.call_one(lambda: s.fileno())
        with pytest.raises(Exception, match="pickle|socket"):
            boom.take.broadcast(lambda: s.fileno())
    assert boom.take.call_one(3).get(timeout=10) == "int"
    assert boom.value.call_one().get(timeout=10) == 0


def test_argument_that_cannot_be_rebuilt_remotely_is_actor_error(boom):
    with pytest.raises(ActorError, match="cannot rebuild me here"):
        boom.take.call_one(UnpicklableOnReceiver()).get(timeout=10)
    assert boom.incr.call_one(2).get(timeout=10) == 2


def test_unpicklable_return_value_is_actor_error(boom):
    with pytest.raises(ActorError, match="pickle") as ei:
        boom.give_lock.call_one().get(timeout=10)
    assert "(pickling the lock that boom.give_lock returned)" in str(ei.value)
    assert "HINT: an endpoint's return value must be picklable" in str(ei.value)
    assert boom.incr.call_one(1).get(timeout=10) == 1


def test_unpicklable_return_value_traceback_starts_at_users_code(boom):
    with pytest.raises(ActorError, match="cannot pickle") as ei:
        boom.give_lock.call_one().get(timeout=10)  # (nothing of the user's: no traceback)
    text = str(ei.value)
    assert "cloudpickle" not in text.replace("picklable by cloudpickle", "") and "port.py" not in text
    with pytest.raises(ActorError, match="refuses to be pickled") as ei:
        boom.give_refusing.call_one().get(timeout=10)
    text = str(ei.value)
    assert "in __reduce__" in text and "test_errors.py" in text
    assert "(pickling the RefusesPickling that boom.give_refusing returned)" in text
    assert "port.py" not in text and "payload.py" not in text


def test_unpicklable_exception_still_reported_as_actor_error(procs1):
    m = procs1.spawn("custom", RaisesCustom)
    with pytest.raises(ActorError, match="holding a lock") as ei:
        m.fail_unpicklable.call_one().get(timeout=10)
    assert "LockedError" in str(ei.value)
    assert m.ok.call_one().get(timeout=10) == "ok"


def test_keyword_only_arguments_checked(procs1):
    m = procs1.spawn("custom", RaisesCustom)
    assert m.kw_only.call_one(1, k=2).get(timeout=10) == (1, 2)
    with pytest.raises(TypeError):
        m.kw_only.call_one(1, 2)
    with pytest.raises(TypeError):
        m.kw_only.call_one(k=2)
    assert m.kw_only.call_one(5).get(timeout=10) == (5, 1)


def test_exception_that_cannot_be_rebuilt_at_the_caller_is_still_actor_error(procs1):
    m = procs1.spawn("custom", RaisesCustom)
    with pytest.raises(ActorError, match="E42: custom detail"):
        m.fail.call_one().get(timeout=10)
    assert m.ok.call_one().get(timeout=10) == "ok"


def test_unpicklable_return_value_local_actor():
    m = this_proc().spawn("local_boom", Boom)
    try:
        with pytest.raises(ActorError, match="pickle") as ei:
            m.give_lock.call_one().get(timeout=10)
        assert "HINT: an endpoint's return value must be picklable" in str(ei.value)
        assert m.incr.call_one(5).get(timeout=10) == 5
    finally:
        m.stop().get(timeout=10)


# -- failures that end an actor: they reach the client's unhandled_fault_hook, so each runs
# -- in its own client process with a recording hook.

FAILURE_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import monarch.actor
    from monarch.actor import Actor, endpoint, this_host, SupervisionError

    faults = []
    monarch.actor.unhandled_fault_hook = lambda f: faults.append(str(f))

    class Fragile(Actor):
        def __init__(self, fail_init=False):
            if fail_init:
                raise ValueError("This is an exception from __init__")

        @endpoint
        def base_exception(self):
            raise SystemExit("leaving the actor")

        @endpoint
        def exit_process(self):
            os._exit(3)

        @endpoint
        def check(self):
            return "this is a healthy check"

    out = {}
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    a = pm.spawn("fragile_a", Fragile)
    b = pm.spawn("fragile_b", Fragile)

    try:
        a.slice(gpus=1).base_exception.call_one().get(timeout=10)
        out["base_exception"] = "no error"
    except SupervisionError as e:
        out["base_exception"] = str(e)
    except Exception as e:
        out["base_exception"] = "wrong type " + type(e).__name__ + ": " + str(e)
    try:
        a.check.call().get(timeout=10)
        out["after"] = "no error"
    except RuntimeError as e:
        out["after"] = str(e)
    out["slice_ok"] = a.slice(gpus=0).check.call_one().get(timeout=10)
    out["sibling_ok"] = b.check.call().get(timeout=10).values()

    c = pm.spawn("fragile_c", Fragile, True)
    try:
        c.check.call().get(timeout=10)
        out["init"] = "no error"
    except Exception as e:
        out["init"] = type(e).__name__ + ": " + str(e)

    try:
        b.slice(gpus=0).exit_process.call_one().get(timeout=10)
        out["exit"] = "no error"
    except SupervisionError as e:
        out["exit"] = str(e)
    pm.stop().get(timeout=10)
    out["faults"] = faults
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def _run(code: str, timeout: float = 45, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def _result(proc: subprocess.CompletedProcess) -> dict:
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"no result; rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")


def test_failures_that_kill_actors_are_supervision_errors():
    proc = _run(FAILURE_SCRIPT)
    out = _result(proc)
    assert proc.returncode == 0, proc.stderr
    assert "leaving the actor" in out["base_exception"]
    assert "and all its descendants have failed" in out["base_exception"]
    assert "descendants have failed" in out["after"] or "failure on mesh" in out["after"]
    assert out["slice_ok"] == "this is a healthy check"
    assert out["sibling_ok"] == ["this is a healthy check"] * 2
    assert out["init"].startswith("SupervisionError")
    assert "This is an exception from __init__" in out["init"]
    assert "fragile_b" in out["exit"] or "exit_process" in out["exit"]
    assert "exit" in out["exit"]
    faults = "\n".join(out["faults"])
    assert "fragile_a" in faults and "leaving the actor" in faults
    assert "fragile_c" in faults and "This is an exception from __init__" in faults


def test_broadcast_exception_reaches_default_fault_hook_and_exits_1():
    code = textwrap.dedent(
        """
        import atexit, sys
        from monarch.actor import Actor, endpoint, this_host

        atexit.register(lambda: print("atexit ran", flush=True))

        class Bad(Actor):
            @endpoint
            def explode(self):
                raise ValueError("broadcast went wrong")

            @endpoint
            def ping(self):
                return 1

        pm = this_host().spawn_procs(per_host={"gpus": 1})
        m = pm.spawn("bad_mesh", Bad)
        m.ping.call_one().get(timeout=10)
        m.explode.broadcast()
        import threading
        threading.Event().wait(30)   # the fault ends the main thread
        print("not reached", flush=True)
        """
    )
    proc = _run(code)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "not reached" not in proc.stdout
    assert "atexit ran" in proc.stdout
    assert "Unhandled monarch error on the root actor" in proc.stderr
    assert "broadcast went wrong" in proc.stderr
    assert "bad_mesh" in proc.stderr
