"""The whole actor API over TCP: ``enable_transport("tcp")`` before the first spawn puts the
client and every proc it spawns on TCP listeners (loopback by default)."""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers import run_python

from monarch.actor import enable_transport

SCRIPT = textwrap.dedent(
    """
    import asyncio, hashlib, json, os, signal, time
    import numpy as np
    import monarch.actor
    from monarch.actor import Actor, Channel, SupervisionError, endpoint, enable_transport, send, this_host
    from monarch._src.actor.process_state import runtime

    enable_transport("tcp")
    failures = []
    monarch.actor.unhandled_fault_hook = lambda failure: failures.append(failure.crashed_ranks)

    class Node(Actor):
        def __init__(self):
            self.v = 0

        @endpoint
        async def where(self):
            return runtime().address

        @endpoint
        async def pid(self):
            return os.getpid()

        @endpoint
        async def incr(self, by):
            self.v += by

        @endpoint
        async def value(self):
            return self.v

        @endpoint
        async def echo(self, x):
            return x

        @endpoint
        async def checksum(self, a):
            return hashlib.sha256(memoryview(a)).hexdigest(), a.nbytes

        @endpoint
        async def big(self, n):
            return np.full(n, 7, dtype=np.uint8)

        @endpoint
        async def hang(self):
            await asyncio.Event().wait()

    out = {}
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    n = pm.spawn("node", Node)
    out["client"] = runtime().address
    out["procs"] = sorted(n.where.call().get(timeout=30).values())
    out["call_one"] = n.slice(gpus=1).echo.call_one("one").get(timeout=10)
    n.incr.broadcast(5)
    out["broadcast"] = n.value.call().get(timeout=10).values()
    out["stream"] = sorted(f.get(timeout=10) for f in n.value.stream())
    out["choose"] = n.value.choose().get(timeout=10)
    port, receiver = Channel.open()
    send(n.echo, ("via port",), {}, port=port, selection="all")
    out["port"] = [receiver.recv().get(timeout=10) for _ in range(2)]
    a = np.frombuffer(os.urandom(64 << 20), dtype=np.uint8)
    out["payload"] = n.checksum.call(a).get(timeout=60).values()
    out["expected"] = [hashlib.sha256(memoryview(a)).hexdigest(), a.nbytes]
    reply = n.slice(gpus=0).big.call_one(64 << 20).get(timeout=60)
    out["reply"] = [reply.nbytes, int(reply[-1])]
    out["shm"] = [f for f in os.listdir("/dev/shm") if runtime().job_tag in f and not f.endswith(".lock")]
    victim = n.slice(gpus=1)
    victim_pid = victim.pid.call_one().get(timeout=10)
    pending = victim.hang.call_one()
    os.kill(victim_pid, signal.SIGKILL)
    start = time.monotonic()
    try:
        pending.get(timeout=30)
        out["killed"] = "no error"
    except SupervisionError as e:
        out["killed"] = str(e)
    out["killed_s"] = time.monotonic() - start
    out["survivor"] = n.slice(gpus=0).value.call_one().get(timeout=10)
    pm.stop().get(timeout=10)
    out["failures"] = failures
    print("RESULT", json.dumps(out), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_actor_api_over_tcp_loopback() -> None:
    proc = run_python(SCRIPT, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    # The client and its procs listen on loopback TCP, and mesh references carry those addresses.
    assert out["client"].startswith("tcp:127.0.0.1:")
    assert len(out["procs"]) == 2 and all(a.startswith("tcp:127.0.0.1:") for a in out["procs"])
    assert out["call_one"] == "one"
    assert out["broadcast"] == [5, 5] and out["stream"] == [5, 5] and out["choose"] == 5
    assert out["port"] == ["via port", "via port"]
    # 64 MiB each way, inline: no shared-memory file of this job was made for a TCP peer.
    assert out["payload"] == [out["expected"]] * 2
    assert out["reply"] == [64 << 20, 7]
    assert out["shm"] == []
    # A proc killed mid-call fails the pending call quickly; the other rank keeps working.
    assert "killed by SIGKILL" in out["killed"], out["killed"]
    assert out["killed_s"] < 5
    assert out["survivor"] == 5
    assert out["failures"] == [[1]]


def test_unknown_transport_lists_the_accepted_ones() -> None:
    with pytest.raises(ValueError) as info:
        enable_transport("carrier-pigeon")
    message = str(info.value)
    assert "carrier-pigeon" in message
    assert all(name in message for name in ("ipc", "tcp", "tls"))


def test_enable_transport_after_the_runtime_started_says_when_to_call_it(procs1: object) -> None:
    with pytest.raises(RuntimeError) as info:
        enable_transport("tcp")
    assert "must be called before any other calls in the monarch API" in str(info.value)
    assert "HINT" in str(info.value)
    enable_transport("ipc")  # what it runs on already: nothing to change


def test_tls_transport_without_certificates_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="MONARCH_TLS_CERT"):
        enable_transport("tls")
