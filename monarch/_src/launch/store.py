"""A key-value store server that speaks the wire protocol of ``torch.distributed.TCPStore``.

torchrun hosts a ``TCPStore`` for its workers and tells them so with
``TORCHELASTIC_USE_AGENT_STORE=True``: ``init_process_group()`` then connects to
``MASTER_ADDR:MASTER_PORT`` as a client and never starts a server itself. The launcher
must not import torch (that is two seconds), so it serves the protocol itself, here, in
pure Python, on an event loop of its own (a daemon thread), so that a busy runtime loop
never delays a rendezvous.

One server per attempt: a restarted worker group gets an empty store (on a new port when
the port was chosen by the system), so no worker ever reads keys a previous attempt left
behind. That is the difference from torchrun 2.13, whose restarts reuse a stale store and
can hang in ``init_process_group`` (pytorch/pytorch#135712).

The protocol, as the C++ client speaks it (integers are little-endian, lengths are u64):

* a connection starts with ``VALIDATE`` (command byte 0, then the u32 magic
  ``0x3C85F7CE``); nothing is answered;
* every request is one command byte followed by its arguments; keys and values are
  ``u64 length + bytes``; key lists are ``u64 count`` then that many keys;
* ``SET``, ``APPEND``, ``MULTI_SET`` and ``QUEUE_PUSH`` have no answer; ``GET`` and
  ``COMPARE_SET`` answer a value; ``ADD``, ``GETNUMKEYS``, ``DELETE_KEY`` and ``QUEUE_LEN``
  answer an i64; ``CHECK`` answers one byte (0 ready, 1 not ready); ``WAIT`` answers one
  byte (0 "stop waiting") once every key exists, and ``CANCEL_WAIT`` withdraws a pending
  wait and answers 1 ("wait canceled"); ``PING`` echoes its u32; ``QUEUE_POP`` answers the
  queue length (i64) and, when it was not empty, the popped value; ``LIST_KEYS`` answers
  a count (i64) and that many keys; ``BARRIER`` (a key and an i64 party count) answers
  one byte (0) to every party once that many have arrived.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger("monarch.launch.store")

_T = TypeVar("_T")

__all__ = ["StoreServer", "bind_addresses"]

VALIDATE_MAGIC = 0x3C85F7CE

(
    VALIDATE,
    SET,
    COMPARE_SET,
    GET,
    ADD,
    CHECK,
    WAIT,
    GETNUMKEYS,
    DELETE_KEY,
    APPEND,
    MULTI_GET,
    MULTI_SET,
    CANCEL_WAIT,
    PING,
    QUEUE_PUSH,
    QUEUE_POP,
    QUEUE_LEN,
    LIST_KEYS,
    BARRIER,
) = range(19)

CHECK_READY, CHECK_NOT_READY = b"\x00", b"\x01"
WAIT_STOP, WAIT_CANCELED = b"\x00", b"\x01"

#: Limits that keep a confused or hostile peer from making us allocate without bound.
MAX_KEY_LEN = 1 << 20
MAX_VALUE_LEN = 1 << 30
MAX_KEY_COUNT = 1 << 20

#: The protocol's integers (little-endian), shared with the client in ``store_client``.
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
I64 = struct.Struct("<q")


class _ProtocolError(Exception):
    """The peer sent something this server does not understand; its connection is closed."""


class _Reader:
    """Incremental parsing over the bytes received so far; ``None`` means "need more"."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes | None:
        end = self.pos + n
        if end > len(self.buf):
            return None
        data = bytes(self.buf[self.pos : end])
        self.pos = end
        return data

    def u32(self) -> int | None:
        raw = self.take(4)
        return None if raw is None else U32.unpack(raw)[0]

    def u64(self) -> int | None:
        raw = self.take(8)
        return None if raw is None else U64.unpack(raw)[0]

    def i64(self) -> int | None:
        raw = self.take(8)
        return None if raw is None else I64.unpack(raw)[0]

    def blob(self, limit: int) -> bytes | None:
        size = self.u64()
        if size is None:
            return None
        if size > limit:
            raise _ProtocolError(f"length {size} over the limit {limit}")
        return self.take(size)

    def key(self) -> str | None:
        raw = self.blob(MAX_KEY_LEN)
        return None if raw is None else raw.decode("utf-8", "surrogateescape")

    def keys(self) -> list[str] | None:
        return self._counted(self.key)

    def key_value(self) -> tuple[str, bytes] | None:
        key = self.key()
        if key is None:
            return None
        value = self.blob(MAX_VALUE_LEN)
        return None if value is None else (key, value)

    def pairs(self) -> list[tuple[str, bytes]] | None:
        """Count-prefixed (key, value) pairs (MULTI_SET)."""
        return self._counted(self.key_value)

    def _counted(self, read_one: Callable[[], _T | None]) -> list[_T] | None:
        """A u64 count, then that many items; None while the request is incomplete."""
        count = self.u64()
        if count is None:
            return None
        if count > MAX_KEY_COUNT:
            raise _ProtocolError(f"{count} keys in one request")
        out = []
        for _ in range(count):
            item = read_one()
            if item is None:
                return None
            out.append(item)
        return out


def blob(value: bytes) -> bytes:
    """A length-prefixed value, as both sides of the protocol write it."""
    return U64.pack(len(value)) + value


class _Client(asyncio.Protocol):
    """One connection: parses requests as they arrive and answers in order."""

    def __init__(self, server: StoreServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.validated = False
        #: keys this connection still waits for (a WAIT in progress), else None.
        self.waiting: set[str] | None = None
        #: the barrier this connection waits at, else None.
        self.barrier: str | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.server._clients.add(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server._forget_waiter(self)
        self.server._clients.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            while self.buf:
                reader = _Reader(self.buf)
                if not self._one(reader):
                    break  # an incomplete request: wait for more bytes
                del self.buf[: reader.pos]
        except _ProtocolError as err:
            logger.debug("closing a store connection: %s", err)
            self.buf.clear()
            if self.transport is not None:
                self.transport.close()

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _one(self, r: _Reader) -> bool:
        """Handle one complete request from ``r``; False if it is not complete yet."""
        key: str | None  # each command reads its own key; None while the request is incomplete
        cmd = r.take(1)
        if cmd is None:
            return False
        op = cmd[0]
        store = self.server
        if not self.validated:
            if op != VALIDATE:
                raise _ProtocolError(f"command {op} before validation")
            magic = r.u32()
            if magic is None:
                return False
            if magic != VALIDATE_MAGIC:
                raise _ProtocolError("bad validation number")
            self.validated = True
            return True
        if op == VALIDATE:
            return r.u32() is not None
        if op == PING:
            nonce = r.take(4)
            if nonce is None:
                return False
            self.send(nonce)
            return True
        if op == SET or op == APPEND:
            kv = r.key_value()
            if kv is None:
                return False
            key, value = kv
            if op == SET:
                store._set(key, value)
            else:
                store._set(key, store.data.get(key, b"") + value)
            return True
        if op == COMPARE_SET:
            key = r.key()
            if key is None:
                return False
            expected = r.blob(MAX_VALUE_LEN)
            if expected is None:
                return False
            desired = r.blob(MAX_VALUE_LEN)
            if desired is None:
                return False
            current = store.data.get(key)
            if current is None:
                if expected == b"":
                    store._set(key, desired)
                    self.send(blob(desired))
                else:
                    self.send(blob(expected))
            else:
                if current == expected:
                    store._set(key, desired)
                    current = desired
                self.send(blob(current))
            return True
        if op == GET:
            key = r.key()
            if key is None:
                return False
            self.send(blob(store.data.get(key, b"")))
            return True
        if op == ADD:
            key = r.key()
            if key is None:
                return False
            delta = r.i64()
            if delta is None:
                return False
            old = store.data.get(key)
            try:
                total = delta + (int(old) if old is not None else 0)
            except ValueError:
                raise _ProtocolError(f"ADD on a non-integer value of {key!r}") from None
            store._set(key, str(total).encode())
            self.send(I64.pack(total))
            return True
        if op == CHECK:
            keys = r.keys()
            if keys is None:
                return False
            self.send(CHECK_READY if store._has_all(keys) else CHECK_NOT_READY)
            return True
        if op == WAIT:
            keys = r.keys()
            if keys is None:
                return False
            missing = {k for k in keys if not store._has(k)}
            if not missing:
                self.send(WAIT_STOP)
            else:
                self.waiting = missing
                for k in missing:
                    store._waiters[k].add(self)
            return True
        if op == CANCEL_WAIT:
            store._forget_waiter(self)
            self.send(WAIT_CANCELED)
            return True
        if op == GETNUMKEYS:
            self.send(I64.pack(len(store.data)))
            return True
        if op == DELETE_KEY:
            key = r.key()
            if key is None:
                return False
            self.send(I64.pack(1 if store.data.pop(key, None) is not None else 0))
            return True
        if op == MULTI_GET:
            keys = r.keys()
            if keys is None:
                return False
            self.send(b"".join(blob(store.data.get(k, b"")) for k in keys))
            return True
        if op == MULTI_SET:
            pairs = r.pairs()
            if pairs is None:
                return False
            for key, value in pairs:
                store._set(key, value)
            return True
        if op == QUEUE_PUSH:
            kv = r.key_value()
            if kv is None:
                return False
            key, value = kv
            store._queues[key].append(value)
            store._wake(key, only_one=True)
            return True
        if op == QUEUE_POP:
            key = r.key()
            if key is None:
                return False
            queue = store._queues[key]
            out = I64.pack(len(queue))
            if queue:
                out += blob(queue.popleft())
            self.send(out)
            return True
        if op == QUEUE_LEN:
            key = r.key()
            if key is None:
                return False
            self.send(I64.pack(len(store._queues.get(key, ()))))
            return True
        if op == LIST_KEYS:
            keys = list(store.data)
            self.send(
                I64.pack(len(keys)) + b"".join(blob(k.encode("utf-8", "surrogateescape")) for k in keys)
            )
            return True
        if op == BARRIER:
            key = r.key()
            if key is None:
                return False
            parties = r.i64()
            if parties is None:
                return False
            waiting = store._barriers.setdefault(key, [])
            waiting.append(self)
            self.barrier = key
            if len(waiting) >= parties:
                del store._barriers[key]
                for client in waiting:
                    client.barrier = None
                    client.send(WAIT_STOP)
            return True
        raise _ProtocolError(f"unsupported command {op}")


def bind_addresses(host: str) -> list[tuple[int, tuple[Any, ...]]]:
    """The distinct (family, sockaddr-without-port) pairs ``host`` resolves to."""
    seen: list[tuple[int, tuple[Any, ...]]] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM):
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        entry = (family, (sockaddr[0],) + tuple(sockaddr[2:]))
        if entry not in seen:
            seen.append(entry)
    return seen


class StoreServer:
    """A TCPStore-compatible server on ``host:port`` (``port=0``: one the system picks).

    It listens on every address ``host`` resolves to (``localhost``: 127.0.0.1 and ::1),
    all on the same port, so a client finds it whichever address it tries first.
    ``start()`` returns once it listens; ``port`` is then the real port.
    """

    def __init__(self, host: str, port: int = 0) -> None:
        self.host = host
        self.requested_port = port
        self.port = 0
        self.data: dict[str, bytes] = {}
        self._queues: collections.defaultdict[str, collections.deque[bytes]] = collections.defaultdict(
            collections.deque
        )
        self._waiters: collections.defaultdict[str, set[_Client]] = collections.defaultdict(set)
        self._clients: set[_Client] = set()
        self._barriers: dict[str, list[_Client]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.AbstractServer] = []

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> StoreServer:
        sockets = self._bind()
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                for sock in sockets:
                    self._servers.append(
                        loop.run_until_complete(loop.create_server(lambda: _Client(self), sock=sock))
                    )
            except BaseException as e:  # noqa: B036 - reported to start()
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                for server in self._servers:
                    server.close()
                for client in list(self._clients):
                    if client.transport is not None:
                        client.transport.abort()
                loop.run_until_complete(asyncio.sleep(0))
                loop.close()

        self._thread = threading.Thread(target=main, name="monarch-launch-store", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("the rendezvous store did not start")
        if failure:
            raise failure[0]
        return self

    def _bind(self) -> list[socket.socket]:
        addresses = bind_addresses(self.host)
        if not addresses:
            raise OSError(f"{self.host} resolves to no IPv4/IPv6 address")
        sockets: list[socket.socket] = []
        port = self.requested_port
        errors: list[str] = []
        for family, sockaddr in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((sockaddr[0], port) + tuple(sockaddr[1:]))
                sock.listen(1024)
                sock.setblocking(False)
            except OSError as e:
                sock.close()
                errors.append(f"{sockaddr[0]}: {e}")
                if not sockets and port == 0:
                    continue  # the first address could not be used; try the next
                continue  # an extra address (say ::1 without IPv6) is optional
            if not sockets:
                port = sock.getsockname()[1]
            sockets.append(sock)
        if not sockets:
            raise OSError(f"cannot listen on {self.host}:{self.requested_port}: " + "; ".join(errors))
        self.port = port
        return sockets

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = None
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:
            pass  # already closed
        thread.join(5.0)

    def clear(self, keep_prefix: str, timeout: float = 10.0) -> None:
        """Delete every key and queue not under ``keep_prefix`` (thread-safe).

        The static backend serves the rendezvous and the workers from one store at
        ``--master-port``; clearing the workers' keys before a new round gives a restarted
        group an empty store, as a fresh server does for c10d.
        """
        loop = self._loop
        if loop is None:
            return
        done = threading.Event()

        def clear() -> None:
            for key in [k for k in self.data if not k.startswith(keep_prefix)]:
                del self.data[key]
            self._queues.clear()
            done.set()

        loop.call_soon_threadsafe(clear)
        if not done.wait(timeout):
            raise RuntimeError("the rendezvous store did not clear its keys in time")

    def __enter__(self) -> StoreServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the data (loop thread only) ------------------------------------------------------------

    def _has(self, key: str) -> bool:
        return key in self.data or bool(self._queues.get(key))

    def _has_all(self, keys: list[str]) -> bool:
        return all(self._has(k) for k in keys)

    def _set(self, key: str, value: bytes) -> None:
        self.data[key] = value
        self._wake(key)

    def _wake(self, key: str, only_one: bool = False) -> None:
        waiters = self._waiters.get(key)
        if not waiters:
            return
        for client in list(waiters):
            pending = client.waiting
            waiters.discard(client)
            if pending is not None:
                pending.discard(key)
                if not pending:
                    client.waiting = None
                    client.send(WAIT_STOP)
                    if only_one:
                        break
        if not waiters:
            self._waiters.pop(key, None)

    def _forget_waiter(self, client: _Client) -> None:
        if client.barrier is not None:
            parties = self._barriers.get(client.barrier)
            if parties is not None and client in parties:
                parties.remove(client)
            client.barrier = None
        pending = client.waiting
        client.waiting = None
        if not pending:
            return
        for key in pending:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(client)
                if not waiters:
                    self._waiters.pop(key, None)
