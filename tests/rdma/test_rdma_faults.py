"""Transfers that cannot complete end with a clear error, never a hang: a dropped buffer
(Monarch's error), an owner frozen past the timeout (``TimeoutError``), an owner killed before
or during a transfer (its death, well within the timeout)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from helpers import freeze, wait_until
from rdma_actors import Owner

import monarch.actor
from monarch._src.rdma import vm_copy
from monarch._src.runtime.config import CONFIG
from monarch.actor import ProcMesh, this_host

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20


@pytest.fixture(params=["auto", "tcp"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(CONFIG, "rdma_backend", request.param)
    return request.param


@pytest.fixture
def mesh(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProcMesh]:
    """One proc, whose death the test causes (the client must not exit on it)."""
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", lambda failure: None)
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm
    pm.stop().get(timeout=10)


def test_a_dropped_buffer_fails_reads_and_writes_with_monarchs_error(mesh: ProcMesh, backend: str) -> None:
    owner = mesh.spawn("owner", Owner, MIB)
    buf = owner.get_buffer.call_one().get()
    owner.drop.call_one().get(timeout=30)
    with pytest.raises(RuntimeError, match=r"RDMABuffer 1 of .*owner.* has been dropped") as e:
        buf.read_into(memoryview(bytearray(MIB))).get(timeout=30)
    assert "HINT:" in str(e.value)
    with pytest.raises(RuntimeError, match="has been dropped"):
        buf.write_from(memoryview(b"x")).get(timeout=30)
    assert buf.drop().get(timeout=10) is None  # dropping again is harmless


def test_a_reference_holder_can_drop_the_buffer(mesh: ProcMesh, backend: str) -> None:
    owner = mesh.spawn("owner", Owner, MIB)
    buf = owner.get_buffer.call_one().get()
    buf.drop().get(timeout=10)
    with pytest.raises(RuntimeError, match="has been dropped"):
        owner.get_buffer.call_one().get().read_into(memoryview(bytearray(MIB))).get(timeout=30)


def test_a_frozen_owner_fails_the_transfer_at_its_timeout(mesh: ProcMesh, backend: str) -> None:
    owner = mesh.spawn("owner", Owner, MIB)
    buf = owner.get_buffer.call_one().get()
    pid = owner.pid.call_one().get()
    freeze(pid)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="did not finish within its timeout of 1.0 s"):
            buf.read_into(memoryview(bytearray(MIB)), timeout=1).get(timeout=20)
        assert 0.9 < time.monotonic() - start < 5
    finally:
        os.kill(pid, signal.SIGCONT)
    out = bytearray(MIB)
    buf.read_into(memoryview(out)).get(timeout=20)  # thawed, it serves again
    assert owner.digest.call_one().get() == hashlib.sha256(out).hexdigest()


def test_an_owner_killed_before_the_transfer_fails_it_at_once(mesh: ProcMesh, backend: str) -> None:
    owner = mesh.spawn("owner", Owner, MIB)
    buf = owner.get_buffer.call_one().get()
    os.kill(owner.pid.call_one().get(), signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"owner's process \(.*\) died"):
        buf.read_into(memoryview(bytearray(MIB)), timeout=30).get(timeout=40)
    assert time.monotonic() - start < 10


def test_an_owner_killed_during_a_served_transfer_fails_it_well_before_the_timeout(
    mesh: ProcMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(CONFIG, "rdma_backend", "tcp")
    monkeypatch.setattr(CONFIG, "rdma_chunk_bytes", 4096)  # many small requests: a long transfer
    size = 32 * MIB
    owner = mesh.spawn("owner", Owner, size)
    buf = owner.get_buffer.call_one().get()
    pid = owner.pid.call_one().get()
    dst = bytearray(size)
    fut = buf.read_into(memoryview(dst), timeout=30)
    wait_until(lambda: any(dst[:4096]), timeout=20, what="the first chunk")
    freeze(pid)  # mid-transfer, so that the kill lands before the end
    assert not fut.done() and not any(dst[-4096:])
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"owner's process \(.*\) died"):
        fut.get(timeout=40)
    assert time.monotonic() - start < 10


def test_a_one_sided_copy_from_a_dead_process_says_it_is_gone() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ctypes,sys; b=ctypes.create_string_buffer(8192); print(ctypes.addressof(b), flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    address = int(child.stdout.readline())
    out = bytearray(8192)
    local = ctypes.addressof(ctypes.c_char.from_buffer(out))
    vm_copy.copy(child.pid, local, address, 8192, write=False, piece=4096, keep_going=lambda: True)
    child.kill()
    child.wait(10)
    with pytest.raises(vm_copy.OwnerGone):
        vm_copy.copy(child.pid, local, address, 8192, write=False, piece=4096, keep_going=lambda: True)
