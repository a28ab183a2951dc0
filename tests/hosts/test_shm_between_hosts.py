"""Shared memory stays on its host: a message to a proc of another host (reached over TCP)
carries its large buffers inline and never names a ``/dev/shm`` file, while procs of one host
(reached by Unix sockets) keep lending them.

Hosts are network namespaces (``netns``); their processes still share this machine's
``/dev/shm``, so a wrong choice would go unnoticed by the data: the test watches the files.
No host agent: two clients of one job (one secret) in two namespaces, each with its runtime
listening on its namespace's address, and a mesh reference passed from one to the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import netns
import pytest
from helpers import REPO, wait_until
from tcp_helpers import Where, frame_head, handshake, tcp_connect, tcp_procs, worker_log

from monarch._src.actor.process_state import runtime

#: Joins the job whose secret is on stdin, with a runtime listening on TCP at argv[1].
JOIN = textwrap.dedent(
    """
    import base64, hashlib, json, os, sys
    import cloudpickle
    import numpy as np
    from monarch._src.actor.process_state import _hook_runtime_class, runtime
    from monarch._src.runtime import job_files
    from monarch._src.runtime.runtime import Runtime
    from monarch._src.transport.address import listen_tcp
    from monarch.actor import Actor, endpoint, this_host

    _hook_runtime_class()  # the actor layer's handlers go on the runtime made next
    rt = Runtime(
        secret=bytes.fromhex(sys.stdin.readline().strip()),
        socket_dir=job_files.new_job_dir(),
        listen_sock=listen_tcp(sys.argv[1]),
        owns_socket_dir=True,
    )

    def lent_files(job_tag):
        return [f for f in os.listdir("/dev/shm") if f.startswith(f"monarch-{job_tag}-")]

    def memory_of(a):
        # What holds the bytes of an array: a bytearray (read from a socket) or an mmap.
        x = a
        while isinstance(x, (np.ndarray, memoryview)):
            x = x.base if isinstance(x, np.ndarray) else x.obj
        return type(x).__name__

    class Holder(Actor):
        @endpoint
        async def where(self):
            return runtime().address

        @endpoint
        async def digest(self, a):
            return hashlib.sha256(memoryview(a)).hexdigest(), memory_of(a)

        @endpoint
        async def big(self, n):
            return np.full(n, 5, dtype=np.uint8)
    """
)

#: Host 0: spawns a proc (listening where MONARCH_TRANSPORT and MONARCH_TCP_BIND_HOST say:
#: on TCP at its address); prints the mesh reference.
HOST0 = JOIN + textwrap.dedent(
    """
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    holder = pm.spawn("holder", Holder)
    holder.digest.call_one(np.zeros(1, np.uint8)).get(timeout=30)
    print("MESH", base64.b64encode(cloudpickle.dumps(holder)).decode(), rt.job_tag, flush=True)
    sys.stdin.read()
    print("LENT", json.dumps(lent_files(rt.job_tag)), flush=True)
    pm.stop().get(timeout=10)
    """
)

#: Host 1: calls host 0's mesh and a mesh of its own host (Unix sockets) with 64 MiB each.
HOST1 = JOIN + textwrap.dedent(
    """
    remote = cloudpickle.loads(base64.b64decode(sys.argv[2]))
    a = np.frombuffer(os.urandom(64 << 20), dtype=np.uint8)
    out = {"expected": hashlib.sha256(memoryview(a)).hexdigest(), "remote_proc": remote.where.call_one().get(timeout=30)}
    out["remote"] = remote.digest.call_one(a).get(timeout=60)
    out["lent_to_remote"] = lent_files(rt.job_tag)
    reply = remote.big.call_one(64 << 20).get(timeout=60)
    out["reply"] = [reply.nbytes, int(reply[-1]), memory_of(reply)]
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    local = pm.spawn("local", Holder)
    out["local_proc"] = local.where.call_one().get(timeout=30)
    out["local"] = local.digest.call_one(a).get(timeout=60)
    out["lent_to_local"] = lent_files(rt.job_tag)
    pm.stop().get(timeout=10)
    print("RESULT", json.dumps(out), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_large_buffers_go_inline_between_hosts_and_through_shm_within_one(cluster2: netns.Cluster) -> None:
    h0, h1 = cluster2.hosts
    secret = os.urandom(32).hex() + "\n"
    host0 = cluster2.popen(
        0,
        [sys.executable, "-c", HOST0, h0.address],
        cwd=REPO,
        env={**os.environ, "MONARCH_TRANSPORT": "tcp", "MONARCH_TCP_BIND_HOST": h0.address},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert host0.stdin is not None and host0.stdout is not None
    host0.stdin.write(secret)
    host0.stdin.flush()
    line = host0.stdout.readline()
    assert line.startswith("MESH "), line
    _, mesh, host0_job = line.split()
    done = cluster2.run(
        1,
        [sys.executable, "-c", HOST1, h1.address, mesh],
        input=secret,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    host0.stdin.close()
    lent_by_host0 = json.loads(host0.stdout.readline().split(" ", 1)[1])
    assert host0.wait(timeout=30) == 0
    out = json.loads(done.stdout.split("RESULT ", 1)[1])

    assert out["remote_proc"].startswith(f"tcp:{h0.address}:")
    assert out["local_proc"].startswith("unix:")
    # Across hosts: the data arrived whole, inline (read into a bytearray, not mapped), and
    # neither side made a shared-memory file for the other.
    assert out["remote"] == [out["expected"], "bytearray"]
    assert out["reply"] == [64 << 20, 5, "bytearray"]
    assert out["lent_to_remote"] == [] and lent_by_host0 == []
    # Within host 1: the same 64 MiB went through a file of /dev/shm, mapped by the receiver.
    assert out["local"] == [out["expected"], "mmap"]
    assert len(out["lent_to_local"]) == 1
    assert host0_job  # (named in the files it would have lent)


@pytest.mark.timeout(60)
def test_a_frame_over_tcp_naming_a_shm_file_is_rejected_and_the_file_left_alone() -> None:
    """A peer reached over TCP cannot make the receiver open (and consume) a file of its host's
    /dev/shm, whatever the header of its frame says."""
    name = f"monarch-{runtime().job_tag}-{os.urandom(8).hex()}"  # a live job's: never swept
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as f:
        f.write(b"not yours")
    try:
        with tcp_procs() as pm:
            pid, address = pm.spawn("where", Where).where.call_one().get(timeout=30)
            with tcp_connect(address) as s:
                assert len(handshake(s, runtime().secret)) == 32
                s.sendall(frame_head({"k": 9999, "b": [0, len(name)], "shm": [1]}) + name.encode())
                wait_until(
                    lambda: "from another host that refers to shared memory" in worker_log(pid),
                    what="the frame to be rejected",
                )
            assert "unknown kind 9999" not in worker_log(pid)  # rejected before it was routed
        with open(path, "rb") as f:
            assert f.read() == b"not yours"
    finally:
        os.unlink(path)
