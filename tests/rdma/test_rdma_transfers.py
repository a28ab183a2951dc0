"""Bytes move between a registered buffer and local memory, by each way this machine offers:
a one-sided copy between processes of one host (``auto``) and chunks served by the owner's
runtime (``tcp``, what other hosts get; through /dev/shm within a host). Same results in both:
leading bytes only, several readers at once, and the owning actor's thread never involved."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from rdma_actors import Owner, Reader, digest

from monarch._src.actor.process_state import runtime
from monarch._src.runtime.config import CONFIG
from monarch.actor import this_host
from monarch.rdma import RDMAAction, RDMABuffer

pytestmark = pytest.mark.timeout(60)

MIB = 1 << 20
SIZE = 16 * MIB


@pytest.fixture(scope="module")
def owner() -> Iterator[Owner]:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm.spawn("owner", Owner, SIZE)
    pm.stop().get(timeout=10)


@pytest.fixture(params=["auto", "tcp"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The setting this (reading) process uses: ``auto`` copies memory one-sidedly here."""
    monkeypatch.setattr(CONFIG, "rdma_backend", request.param)
    return request.param


def _frames_to(address: str) -> int:
    return runtime().frames_sent().get(address, 0)


def test_read_into_a_larger_destination_writes_only_the_leading_bytes(owner: Owner, backend: str) -> None:
    buf = owner.get_buffer.call_one().get()
    dst = bytearray(b"\x07" * (SIZE + 4096))
    sent = _frames_to(buf._remote.address)
    assert buf.read_into(memoryview(dst)).get(timeout=30) is None
    # One-sided: a pin and its release, whatever the size; served: a request per chunk (and
    # the /dev/shm files of the answers given back).
    frames = _frames_to(buf._remote.address) - sent
    assert frames == 2 if backend == "auto" else frames >= SIZE // CONFIG.rdma_chunk_bytes
    assert digest(memoryview(dst)[:SIZE]) == owner.digest.call_one().get()
    assert dst[SIZE:] == b"\x07" * 4096


def test_write_from_a_smaller_source_writes_only_the_leading_bytes(owner: Owner, backend: str) -> None:
    buf = owner.get_buffer.call_one().get()
    tail = owner.digest.call_one(MIB).get()
    src = os.urandom(MIB - 3)
    buf.write_from(memoryview(src)).get(timeout=30)
    assert owner.digest.call_one(0, MIB - 3).get() == digest(src)
    assert owner.digest.call_one(MIB).get() == tail


def test_futures_are_awaitable_and_an_action_batches_reads_and_writes(owner: Owner, backend: str) -> None:
    buf = owner.get_buffer.call_one().get()
    first, second = bytearray(SIZE), bytearray(SIZE)
    patch = os.urandom(4096)

    async def main() -> None:
        await buf.read_into(memoryview(first))
        action = RDMAAction().write_remote(buf, memoryview(patch)).read_remote(memoryview(second), buf)
        await action.submit()

    asyncio.run(main())
    # The batch's operations run concurrently: the read saw the old or the new first page.
    assert digest(second[4096:]) == digest(first[4096:])
    assert second[:4096] in (first[:4096], patch)
    assert owner.digest.call_one(0, 4096).get() == digest(patch)
    assert RDMAAction().submit().get(timeout=5) is None  # empty: a no-op


def test_several_readers_at_once_get_the_same_bytes(owner: Owner, backend: str) -> None:
    buf = owner.get_buffer.call_one().get()
    pm = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        readers = pm.spawn("readers", Reader)
        digests = readers.read.call(buf, backend).get(timeout=60)
        assert set(digests.values()) == {owner.digest.call_one().get()}
    finally:
        pm.stop().get(timeout=10)


def test_the_owning_actor_takes_no_part(owner: Owner, backend: str, tmp_path: Path) -> None:
    buf = owner.get_buffer.call_one().get()
    release = tmp_path / "release"
    busy = owner.busy_until.call_one(str(release))  # its only thread is held from now on
    try:
        src = os.urandom(SIZE)
        buf.write_from(memoryview(src)).get(timeout=20)
        dst = bytearray(SIZE)
        buf.read_into(memoryview(dst)).get(timeout=20)
        assert dst == src
        assert not busy.done()
    finally:
        release.touch()
    assert busy.get(timeout=30) > 0


def test_a_buffer_of_this_process_is_copied_in_place() -> None:
    torch = pytest.importorskip("torch")
    weights = torch.rand(256, 256)
    buf = RDMABuffer(weights.view(torch.uint8).flatten())
    out = torch.zeros(256, 256)
    buf.read_into(out.view(torch.uint8).flatten()).get(timeout=10)
    assert torch.equal(out, weights)
    buf.write_from(torch.zeros(1024, dtype=torch.uint8)).get(timeout=10)
    assert float(weights.flatten()[:256].abs().sum()) == 0.0
    buf.drop().get(timeout=10)
