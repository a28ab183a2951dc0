"""``call_one`` and ``call`` to actors of other processes reuse what they worked out on their
first call (``ActorEndpoint._call_remote``): the checks that may change from call to call still
run on every one of them (arguments, a stopped mesh, a dead process), and anything but a few
scalar arguments still takes the general path."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from monarch.actor import Actor, SupervisionError, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, x: object = None) -> object:
        return x


@pytest.mark.timeout(60)
def test_repeated_calls_keep_every_check(procs2):
    echo = procs2.spawn("echo", Echo)
    one = echo.slice(gpus=1)
    for i in range(3):  # the first call makes the plan, the others reuse it
        assert one.echo.call_one(i).get(timeout=10) == i
        assert echo.echo.call(i).get(timeout=10).values() == [i, i]
    with pytest.raises(TypeError, match="wrong arguments for endpoint echo"):
        one.echo.call_one(1, 2)
    with pytest.raises(TypeError, match="wrong arguments for endpoint echo"):
        echo.echo.call(1, 2)
    assert one.echo.call_one().get(timeout=10) is None
    assert one.echo.call_one(x="kw").get(timeout=10) == "kw"
    assert echo.echo.call([1, {"a": (2,)}]).get(timeout=10).values() == [[1, {"a": (2,)}]] * 2
    other = procs2.spawn("other", Echo)
    other.stop().get(timeout=10)  # another mesh's stop changes nothing for this one's calls
    assert one.echo.call_one(5).get(timeout=10) == 5
    assert echo.echo.call(6).get(timeout=10).values() == [6, 6]
    with pytest.raises(SupervisionError, match="actor mesh other has been stopped"):
        other.echo.call(0).get(timeout=10)
    echo.stop().get(timeout=10)
    for fut in (one.echo.call_one(0), echo.echo.call(0)):
        assert fut.done()  # failed at the call site: nothing was sent
        with pytest.raises(SupervisionError, match="actor mesh echo has been stopped"):
            fut.get(timeout=10)


@pytest.mark.timeout(90)
def test_calls_right_after_a_death_fail_and_none_hangs(gates2):
    mesh, gates, pids, faults = gates2
    victim = pids.pid.call().get(timeout=10).values()[1]
    two = pids.slice(gpus=1)
    assert two.pid.call_one().get(timeout=10) == victim
    os.kill(victim, signal.SIGKILL)
    # Calls made while the death is being noticed, then after: each one either got its reply
    # in before the death or fails; none waits past its bound.
    for _ in range(200):
        try:
            two.pid.call_one().get(timeout=10)
            pids.pid.call().get(timeout=10)
        except SupervisionError:
            break
    else:
        pytest.fail("calls to a killed process kept succeeding")
    with pytest.raises(SupervisionError):
        two.pid.call_one().get(timeout=10)
    with pytest.raises(SupervisionError):
        pids.pid.call().get(timeout=10)
    with contextlib.suppress(Exception):
        mesh.stop().get(timeout=10)
    assert faults
