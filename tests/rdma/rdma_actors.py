"""Actors shared by the RDMA tests: an owner of registered bytes, and readers elsewhere."""

from __future__ import annotations

import hashlib
import os
import time

from actors import Pid

from monarch._src.runtime.config import CONFIG
from monarch.actor import endpoint
from monarch.rdma import RDMABuffer


def digest(data: object) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()  # type: ignore[arg-type]


class Owner(Pid):
    """Registers ``size`` random bytes; tells their digest; can be kept busy."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(os.urandom(size))
        self.buffer = RDMABuffer(memoryview(self.data))

    @endpoint
    def get_buffer(self) -> RDMABuffer:
        return self.buffer

    @endpoint
    def digest(self, start: int = 0, end: int | None = None) -> str:
        return digest(memoryview(self.data)[start:end])

    @endpoint
    def drop(self) -> None:
        self.buffer.drop().get(timeout=30)

    @endpoint
    def busy_until(self, path: str) -> float:
        """Hold this actor's thread until ``path`` exists (the test creates it)."""
        start = time.monotonic()
        while not os.path.exists(path) and time.monotonic() - start < 30:
            time.sleep(0.005)
        return time.monotonic() - start


class Reader(Pid):
    """Reads or writes a buffer from its own process, with the given backend setting."""

    @endpoint
    def read(self, buffer: RDMABuffer, backend: str) -> str:
        CONFIG.rdma_backend = backend
        dst = bytearray(buffer.size())
        buffer.read_into(memoryview(dst)).get(timeout=60)
        return digest(dst)

    @endpoint
    def write(self, buffer: RDMABuffer, backend: str, data: bytes) -> None:
        CONFIG.rdma_backend = backend
        buffer.write_from(memoryview(data)).get(timeout=60)
