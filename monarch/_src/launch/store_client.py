"""A blocking client for the ``torch.distributed.TCPStore`` wire protocol, in pure Python.

The multi-node rendezvous (:mod:`.rendezvous`) talks to a store that another launcher may
host, and the launcher never imports torch, so it speaks the protocol itself: the same
bytes as torch's C++ client (see :mod:`.store` for the format), so the store may also be a
real ``TCPStore`` server. One client is one connection and is used by one thread.

Every call is bounded by the socket timeout given at construction, except :meth:`wait`,
whose bound is its own ``timeout``; a store that goes away raises :class:`StoreGone`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from .store import (
    ADD,
    COMPARE_SET,
    GET,
    I64,
    MAX_VALUE_LEN,
    MULTI_GET,
    SET,
    U32,
    U64,
    VALIDATE,
    VALIDATE_MAGIC,
    WAIT,
    blob,
)

__all__ = ["StoreClient", "StoreGone", "connect"]


class StoreGone(ConnectionError):
    """The store closed the connection, or did not answer in time."""


def _key(key: str) -> bytes:
    return blob(key.encode("utf-8", "surrogateescape"))


class StoreClient:
    """One connection to a TCPStore server; see the module docstring."""

    def __init__(self, sock: socket.socket, address: str, timeout: float) -> None:
        self._sock = sock
        self.address = address
        self.timeout = timeout
        sock.settimeout(timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send(bytes([VALIDATE]) + U32.pack(VALIDATE_MAGIC))

    # -- requests -----------------------------------------------------------------------------

    def set(self, key: str, value: bytes) -> None:
        self._send(bytes([SET]) + _key(key) + blob(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``; ``b""`` when it is missing (our server's answer)."""
        self._send(bytes([GET]) + _key(key))
        return self._read_blob()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys`` in one round trip; ``b""`` for a missing one."""
        self._send(bytes([MULTI_GET]) + U64.pack(len(keys)) + b"".join(_key(k) for k in keys))
        return [self._read_blob() for _ in keys]

    def add(self, key: str, delta: int) -> int:
        self._send(bytes([ADD]) + _key(key) + I64.pack(delta))
        return int(I64.unpack(self._recv(8))[0])

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (``b""``: missing); the value after."""
        self._send(bytes([COMPARE_SET]) + _key(key) + blob(expected) + blob(desired))
        return self._read_blob()

    def wait(self, keys: list[str], timeout: float | None) -> bool:
        """Block until every key exists (True) or ``timeout`` passes (False; the connection is
        then unusable and closed). ``None`` waits until the store or :meth:`close` ends it."""
        self._send(bytes([WAIT]) + U64.pack(len(keys)) + b"".join(_key(k) for k in keys))
        self._sock.settimeout(timeout)
        try:
            self._recv(1)
        except StoreGone:
            if timeout is not None and self._sock.fileno() != -1:
                self.close()
                return False
            raise
        finally:
            if self._sock.fileno() != -1:
                self._sock.settimeout(self.timeout)
        return True

    def close(self) -> None:
        """Close the connection; a thread blocked in :meth:`wait` gets :class:`StoreGone`."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    # -- bytes ----------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as err:
            raise StoreGone(f"the store at {self.address} is unreachable: {err}") from None

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self._sock.recv(n - len(out))
            except (OSError, ValueError) as err:  # ValueError: closed by another thread
                raise StoreGone(f"the store at {self.address} did not answer: {err}") from None
            if not chunk:
                raise StoreGone(f"the store at {self.address} closed the connection")
            out += chunk
        return bytes(out)

    def _read_blob(self) -> bytes:
        size = U64.unpack(self._recv(8))[0]
        if size > MAX_VALUE_LEN:
            # Not a TCPStore (say, another service on that port): do not allocate its garbage.
            self.close()
            raise StoreGone(f"{self.address} answered a {size}-byte value: is it a TCPStore?")
        return self._recv(size) if size else b""


def connect(
    host: str,
    port: int,
    *,
    timeout: float,
    retry_for: float = 0.0,
    give_up: Callable[[], bool] = lambda: False,
) -> StoreClient:
    """Connect to the store at ``host:port``, retrying refused connections for ``retry_for``
    seconds (the launcher that hosts it may not listen yet) unless ``give_up()`` says stop.

    :raises StoreGone: no store answered in time.
    """
    deadline = time.monotonic() + retry_for
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            return StoreClient(sock, f"{host}:{port}", timeout)
        except OSError as err:
            if time.monotonic() >= deadline or give_up():
                raise StoreGone(f"cannot connect to the rendezvous store at {host}:{port}: {err}") from None
            time.sleep(0.1)  # a poll of an external condition (the host launcher binding its port)
