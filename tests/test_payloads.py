"""Large and binary payloads survive a round trip through an actor intact."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from monarch.actor import Actor, endpoint, this_proc

REPO = Path(__file__).resolve().parents[1]
MIB8 = 8 * 1024 * 1024


class Store(Actor):
    def __init__(self) -> None:
        self.kept = None

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def describe(self, x) -> tuple:
        data = bytes(memoryview(x).cast("B")) if not hasattr(x, "numpy") else x.numpy().tobytes()
        return (type(x).__name__, len(data), data[:16], data[-16:], hashlib.sha256(data).hexdigest())

    @endpoint
    def keep(self, x) -> None:
        self.kept = x

    @endpoint
    def kept_sum(self) -> int:
        return int(self.kept.sum())


@pytest.fixture
def store(procs1):
    return procs1.spawn("store", Store)


def _pattern(n: int) -> bytes:
    return (bytes(range(256)) * (n // 256 + 1))[:n]


def test_8mib_bytes_round_trip(store):
    data = _pattern(MIB8)
    out = store.echo.call_one(data).get(timeout=30)
    assert type(out) is bytes
    assert out == data
    name, n, head, tail, h = store.describe.call_one(data).get(timeout=30)
    assert (name, n, head, tail, h) == (
        "bytes",
        MIB8,
        data[:16],
        data[-16:],
        hashlib.sha256(data).hexdigest(),
    )


def test_8mib_bytearray_round_trip(store):
    data = bytearray(_pattern(MIB8))
    out = store.echo.call_one(data).get(timeout=30)
    assert type(out) is bytearray
    assert out == data


def test_memoryview_contents_round_trip(store):
    raw = _pattern(MIB8)
    view = memoryview(raw)[1:-1]
    out = store.echo.call_one(view).get(timeout=30)
    assert bytes(memoryview(out).cast("B")) == raw[1:-1]


@pytest.mark.parametrize(
    "array",
    [
        np.arange(MIB8 // 8, dtype=np.float64),
        np.arange(24, dtype=np.int32).reshape(2, 3, 4),
        np.arange(1 << 20, dtype=np.int16).reshape(1024, 1024)[::2, 1::3],  # non-contiguous
        np.zeros((0, 5), dtype=np.float32),
    ],
    ids=["8mib_f64", "small_3d", "strided", "empty"],
)
def test_numpy_round_trip(store, array):
    out = store.echo.call_one(array).get(timeout=30)
    assert isinstance(out, np.ndarray)
    assert out.dtype == array.dtype
    assert out.shape == array.shape
    assert np.array_equal(out, array)


def test_torch_cpu_tensor_round_trip(store):
    torch = pytest.importorskip("torch")
    t = torch.arange(MIB8 // 4, dtype=torch.float32).reshape(1024, -1)
    out = store.echo.call_one(t).get(timeout=60)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == t.dtype and out.shape == t.shape
    assert torch.equal(out, t)
    small = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64).t()  # small and non-contiguous
    assert torch.equal(store.echo.call_one(small).get(timeout=30), small)


def test_message_to_local_actor_is_a_copy():
    m = this_proc().spawn("local_store", Store)
    try:
        array = np.ones(MIB8 // 8, dtype=np.int64)  # large enough to travel out of band
        m.keep.call_one(array).get(timeout=10)
        array[:] = 0  # mutating the sender's array must not change what the actor received
        assert m.kept_sum.call_one().get(timeout=10) == MIB8 // 8
    finally:
        m.stop().get(timeout=10)


def test_import_monarch_actor_does_not_import_torch():
    code = "import sys, monarch.actor; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_import_monarch_actor_with_torch_blocked():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from monarch.actor import Actor, endpoint, this_proc\n"
        "class A(Actor):\n"
        "    @endpoint\n"
        "    def f(self, x):\n"
        "        return x * 2\n"
        "m = this_proc().spawn('a', A)\n"
        "print(m.f.call_one(21).get(timeout=10))\n"
    )
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "42"
