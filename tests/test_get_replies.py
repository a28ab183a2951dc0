"""Replies to calls made on a thread without an event loop are read by that thread while it
waits in ``Future.get()`` (runtime/thread_replies.py).

The check that the waiting thread reads its replies itself: the runtime's loop thread is held
busy while the calls are waited for, and they still complete. Then the guarantees on that path:
replies to a thread that is not waiting (read by the runtime's loop), a timeout, a thread that
ends (its address goes to the next thread), a dropped connection, a dead process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

import pytest
from actors import Gate, Pid
from helpers import drop_reply_connection, run_python, runtime_loop_held

from monarch._src.actor.process_state import runtime
from monarch.actor import Actor, SupervisionError, endpoint


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x


@pytest.mark.timeout(60)
def test_blocking_get_reads_its_own_replies(procs2):
    echo = procs2.spawn("echo", Echo)
    one, two = echo.slice(gpus=0), echo.slice(gpus=1)
    assert [one.echo.call_one(0).get(timeout=10), two.echo.call_one(0).get(timeout=10)] == [0, 0]
    with runtime_loop_held():  # both workers reached this thread's address: the loop reads nothing
        assert one.echo.call_one(1).get(timeout=10) == 1
        assert two.echo.choose(2).get(timeout=10) == 2
        pending = [one.echo.call_one(i) for i in range(300)]  # a burst: corked, then written by get()
        assert [f.get(timeout=10) for f in pending] == list(range(300))
    # The replies of several processes to one call are read by the runtime's loop, which wakes
    # the waiting thread once for all of them.
    assert echo.echo.call(3).get(timeout=10).values() == [3, 3]
    address = runtime().thread_replies.of_this_thread()
    assert address is not None and address.address in runtime().loop_replies.addresses


@pytest.mark.timeout(60)
def test_replies_to_a_thread_that_does_not_wait_are_read_by_the_runtime_loop(procs1):
    gate = procs1.spawn("gate", Gate)
    pids = procs1.spawn("pid", Pid)
    handed: list = []
    made, finish = threading.Event(), threading.Event()

    def caller() -> None:
        pids.pid.call_one().get(timeout=10)  # the worker connects to this thread's address
        handed.append(gate.wait.call_one())
        made.set()
        finish.wait(30)  # blocked, but not in Future.get(): it reads nothing

    t = threading.Thread(target=caller)
    t.start()
    try:
        assert made.wait(20)
        assert gate.release.call_one().get(timeout=10) == "released"
        assert handed[0].get(timeout=10) == "done"
    finally:
        finish.set()
        t.join(20)


@pytest.mark.timeout(60)
def test_get_timeout_leaves_the_reply_to_a_later_get(procs1):
    gate = procs1.spawn("gate", Gate)
    pids = procs1.spawn("pid", Pid)
    pids.pid.call_one().get(timeout=10)  # the worker connects to this thread's address
    pending = gate.wait.call_one()
    with pytest.raises(TimeoutError):
        pending.get(timeout=0.2)
    assert gate.release.call_one().get(timeout=10) == "released"
    assert pending.get(timeout=10) == "done"


@pytest.mark.timeout(60)
def test_a_thread_that_ends_gives_its_reply_address_to_the_next(procs1):
    pids = procs1.spawn("pid", Pid)
    rt = runtime()
    pid = pids.pid.call_one().get(timeout=10)
    seen: list = []

    def caller() -> None:
        seen.append((pids.pid.call_one().get(timeout=10), rt.thread_replies.of_this_thread().address))

    for _ in range(10):
        t = threading.Thread(target=caller)
        t.start()
        t.join(20)
    assert [p for p, _ in seen] == [pid] * 10
    main_address = rt.thread_replies.of_this_thread().address
    assert len({a for _, a in seen}) == 1  # each thread had the address the one before gave back
    assert main_address not in {a for _, a in seen}


@pytest.mark.timeout(60)
def test_dropped_reply_connection_keeps_running_calls_and_later_calls_work(procs1):
    gate = procs1.spawn("gate", Gate)
    pids = procs1.spawn("pid", Pid)
    pid = pids.pid.call_one().get(timeout=10)  # the worker connects to this thread's address
    pending = gate.wait.call_one()
    # No reply was lost: the call still running completes over the new connection.
    drop_reply_connection(runtime().thread_replies.of_this_thread(), "this thread's address")
    assert gate.release.call_one().get(timeout=10) == "released"
    assert pending.get(timeout=10) == "done"
    assert pids.pid.call_one().get(timeout=10) == pid


@pytest.mark.timeout(60)
def test_dead_process_fails_the_waiting_get(gates2):
    mesh, gates, pids, faults = gates2
    victim = pids.pid.call().get(timeout=10).values()[1]
    pending = [gates.slice(gpus=1).wait.call_one(), gates.wait.call()]
    killer = threading.Thread(target=os.kill, args=(victim, signal.SIGKILL))
    killer.start()  # while this thread waits in get()
    for fut in pending:
        with pytest.raises(SupervisionError):
            fut.get(timeout=10)
    killer.join(10)
    with contextlib.suppress(Exception):
        mesh.stop().get(timeout=10)
    assert faults  # the owner heard of it too


CLOSED_MID_WAIT = """
import threading, time
from monarch._src.actor.process_state import runtime
from monarch.actor import Actor, endpoint, this_host

class Slow(Actor):
    @endpoint
    def slow(self, s: float) -> int:
        time.sleep(s)  # the workload the caller times out on
        return 1

procs = this_host().spawn_procs(per_host={"gpus": 1})
slow = procs.spawn("slow", Slow)
assert slow.slow.call_one(0).get(timeout=30) == 1  # the worker reached this thread's address
address = runtime().thread_replies.of_this_thread()
assert address is not None
threading.Timer(1.0, lambda: runtime().loop_thread.call_soon(address.close)).start()
start = time.monotonic()
try:
    slow.slow.call_one(4).get(timeout=2.0)
except TimeoutError:
    print(f"timed out after {time.monotonic() - start:.2f} s", flush=True)
procs.stop().get(timeout=30)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_timeout_holds_when_the_threads_address_closes_mid_wait() -> None:
    """The address closes 1 s into a 2 s ``get(timeout)``: the wait goes on on a lock for what is
    left of the 2 s, not for 2 s more. A client of its own (the closed address is this
    process's for good)."""
    run = subprocess.run([sys.executable, "-c", CLOSED_MID_WAIT], capture_output=True, text=True, timeout=50)
    assert run.returncode == 0, run.stderr
    seconds = float(run.stdout.split("timed out after ")[1].split()[0])
    assert 1.9 <= seconds < 2.7, run.stdout


MANY_REPLY_CONNECTIONS = """
import gc, threading
from concurrent.futures import ThreadPoolExecutor
from monarch.actor import Actor, endpoint, this_host

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e6

class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

procs = this_host().spawn_procs(per_host={"gpus": 4})
echo = procs.spawn("echo", Echo)
echo.echo.call(0).get(timeout=30)
gc.collect()
before = rss_mb()
together = threading.Barrier(32)

def calls(i):
    together.wait(timeout=30)  # 32 threads at once: 32 reply addresses, each replied to by 4 workers
    for rank in range(4):
        assert echo.slice(gpus=rank).echo.call_one(i).get(timeout=30) == i

with ThreadPoolExecutor(32) as pool:
    list(pool.map(calls, range(32)))
gc.collect()
print("GROWTH_MB", rss_mb() - before)
procs.stop().get(timeout=30)
"""


@pytest.mark.timeout(90)
def test_reply_connections_cost_little_memory() -> None:
    """Each worker replying to a thread's address holds a connection to it: 128 of them here
    (32 threads x 4 workers). Their read buffers start small (replies come one at a time) and
    grow only for what arrives; at the size of the process's own connections' they cost 32 MB."""
    proc = run_python(MANY_REPLY_CONNECTIONS, timeout=80)
    assert proc.returncode == 0, proc.stderr
    [growth] = [float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("GROWTH_MB ")]
    assert growth < 16, proc.stdout
