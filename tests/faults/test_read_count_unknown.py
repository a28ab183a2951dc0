"""A peer's replacement connection asks what was read of a connection this process has no
record of: the calls whose replies that connection may have carried fail at once, with a clear
error, and no other call does.

A peer whose connection to this process closed reconnects and says in its hello how many frames
it had written on the old one, and which of them were replies; this process answers how many it
read, and the peer sends the rest again (``transport.read_count``). Where this process kept no
record of the old connection (its hello never read here, or given up on after
``peer_unreachable_s``), it answers "unknown": the peer then sends none of them again, as any
may have run here, so the calls waiting for those replies would wait forever. They fail instead
(``ConnectionError``, with a HINT); when the peer's record of the replies it wrote there is
incomplete, every call waiting on it fails.

The peer here is this test, on a raw authenticated connection to a reply address of this
process that the worker never connected to, saying it is the worker: deterministic, where a real
drop would make this process answer "unknown" only in rare races.

Where a record is kept, the answer is exact even after three faults: the old connection drops,
its replacement waits behind it (the old one still carries replies) and drops too, and the next
hello comes before that drop is seen here, or in the same turn of the loop as the ends of both.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from actors import Gate
from fault_helpers import Probe, authenticated_connection, on_loop, worker_log
from helpers import wait_until

from monarch._src.actor import port
from monarch._src.actor.process_state import runtime
from monarch._src.runtime.behind import Behind
from monarch._src.transport import read_count
from monarch._src.transport.connection import IncomingConnection
from monarch._src.transport.socket_reader import SocketReader
from monarch._src.wire import payload
from monarch._src.wire.frame import encode_frame
from monarch._src.wire.protocol import peer_hello, port_value
from monarch.actor import this_host

pytestmark = pytest.mark.timeout(90)


class GateProbe(Gate, Probe):
    """A ``Gate`` that tells where its process is."""


class CallingThread:
    """A thread that makes calls (their replies come to a reply address of its own, which the
    worker connects to only once it replies) and then waits until the test ends."""

    def __init__(self) -> None:
        self._work: list[Any] = []
        self._done = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.address = ""
        self.calls: list[Any] = []
        self.ports: list[int] = []

    def call(self, gate: Any, worker: str, n: int) -> None:
        self._work = [gate, worker, n]
        self._thread.start()
        assert self._ready.wait(30), "the calling thread did not make its calls"

    def _run(self) -> None:
        gate, worker, n = self._work
        self.address = runtime().thread_replies.address_for_thread()
        for _ in range(n):
            before = {h.port_id for h in port.waiting_on(worker)}
            self.calls.append(gate.wait.call_one())
            (new,) = {h.port_id for h in port.waiting_on(worker)} - before
            self.ports.append(new)
        self._ready.set()
        self._done.wait(60)

    def end(self) -> None:
        self._done.set()
        self._thread.join(10)


@pytest.fixture
def gate() -> Iterator[tuple[Any, str]]:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        gate = pm.spawn("gate", GateProbe)
        _, address = gate.where.call_one().get(timeout=30)
        yield gate, address
    finally:
        pm.stop().get(timeout=10)


def ask_what_was_read(address: str, sender: str, previous: tuple[int, int, list, list, int]) -> int:
    """Say hello to ``address`` as ``sender``, replacing a connection that wrote ``previous``;
    the count this process answers."""
    with authenticated_connection(address) as raw:
        raw.sendall(hello(sender, previous))
        return answer(raw)


def hello(sender: str, previous: tuple[int, int, list, list, int] | None = None, of: bytes = b"") -> bytes:
    """``sender``'s hello, asking what was read of its connection ``of`` (the nonce of its
    handshake), which wrote ``previous``."""
    return frame(peer_hello(sender, previous, 0, of), [])


def reply(port_id: int, value: Any) -> bytes:
    """A reply frame, as the worker would send it to a call's port."""
    return frame(port_value(port_id, 0, 0), payload.dumps(value))


def frame(header: dict, bodies: list) -> bytes:
    return b"".join(bytes(b) for b in encode_frame(header, bodies, 1 << 30))


def answer(raw: socket.socket) -> int:
    """The count this process tells on ``raw`` of what it read of the connection it replaces."""
    record = b""
    while len(record) < read_count.RECORD.size:
        chunk = raw.recv(read_count.RECORD.size - len(record))
        assert chunk, "the connection closed before this process answered"
        record += chunk
    kind, count = read_count.RECORD.unpack(record)
    assert kind == read_count.PREVIOUS
    return count


def test_calls_whose_replies_the_unknown_connection_carried_fail(gate: tuple[Any, str]) -> None:
    """The hello lists the reply to the first of two waiting calls: that call fails with a
    clear error, the other completes once released."""
    mesh, worker = gate
    caller = CallingThread()
    caller.call(mesh, worker, 2)
    try:
        first, second = caller.calls
        count = ask_what_was_read(caller.address, worker, (1, 0, [[0, caller.ports[0]]], [], 0))
        assert count == read_count.UNKNOWN
        with pytest.raises(ConnectionError) as failed:
            first.get(timeout=20)
        message = str(failed.value)
        assert "is not known" in message and "HINT: retry the call" in message, message
        assert not second.done()
        assert mesh.release.call_one().get(timeout=20) == "released"
        assert second.get(timeout=20) == "done"
    finally:
        caller.end()
    assert "this process kept no record of that connection" in worker_log(os.getpid())  # this process's log


def test_every_call_waiting_on_the_peer_fails_when_its_record_is_incomplete(gate: tuple[Any, str]) -> None:
    """The peer kept a record of its replies from its second frame on only (``known_from``):
    any call waiting on it may have had its reply in the first, so all of them fail."""
    mesh, worker = gate
    caller = CallingThread()
    caller.call(mesh, worker, 2)
    try:
        assert ask_what_was_read(caller.address, worker, (2, 1, [], [], 0)) == read_count.UNKNOWN
        for call in caller.calls:
            with pytest.raises(ConnectionError, match="is not known"):
                call.get(timeout=20)
        assert mesh.release.call_one().get(timeout=20) == "released"
        assert mesh.wait.call_one().get(timeout=20) == "done"  # later calls work
    finally:
        caller.end()


def waiting_behind(address: str) -> Behind | None:
    """(runtime loop) The wait of a connection to ``address`` behind an older one, if any."""
    return next((w for old, w in runtime()._behind.items() if old.local_address == address), None)


def incoming(address: str) -> dict[IncomingConnection, SocketReader]:
    """(runtime loop) The connections to this process's reply address ``address``, and their
    readers."""
    (lent,) = [a for a in runtime().thread_replies._pool._all if a.address == address]
    return dict(lent._readers)


#: The nonce of the old connection's handshake, which names it in the later hellos.
OLD = os.urandom(32)


class TripleFault:
    """The worker (this test, on raw connections) wrote two replies on its connection to a
    calling thread's reply address, of which this process read the first: then that connection
    dropped at its end, its replacement said hello (and waits behind it: the second reply is
    not here yet), and dropped too before it was told anything; the next connection is
    authenticated, its hello not sent yet."""

    def __init__(self, worker: str, caller: CallingThread) -> None:
        address = caller.address
        self.old = authenticated_connection(address, nonce=OLD)
        self.old.sendall(hello(worker) + reply(caller.ports[0], "zero"))
        assert caller.calls[0].get(timeout=20) == "zero"
        self.dropped = authenticated_connection(address)
        #: What the replacement asks of the old connection.
        self.said = (2, 0, [[0, caller.ports[0]], [1, caller.ports[1]]], [], 0)
        self.dropped.sendall(hello(worker, self.said, OLD))
        self.waiting = wait_until(lambda: on_loop(lambda: waiting_behind(address)), 10, "the wait behind")
        self.next = authenticated_connection(address)
        #: The next connection's hello asks again what the dropped one asked: the worker never
        #: heard the answer (it wrote nothing on it, and numbers its frames on from the same one).
        self.next_hello = hello(worker, self.said, OLD)

    def close(self) -> None:
        for raw in (self.old, self.dropped, self.next):
            raw.close()


@pytest.mark.parametrize("old_delivers", [True, False], ids=["old-delivers", "old-ends"])
def test_a_hello_before_its_previous_connections_drop_is_seen_is_answered_exactly(
    gate: tuple[Any, str], old_delivers: bool
) -> None:
    """The next hello comes while the dropped replacement is still open here (its end not
    seen): the next connection waits in its place, and is told 2 once the old connection
    delivered the second reply, or 1 once it ended without it (then it sends that reply
    again); each call gets its value once. (It was told "unknown" at once: nothing was sent
    again, and the second call waited forever.)"""
    mesh, worker = gate
    caller = CallingThread()
    caller.call(mesh, worker, 2)
    fault = TripleFault(worker, caller)
    try:
        replaced = fault.waiting._new
        fault.next.sendall(fault.next_hello)
        if old_delivers:
            fault.old.sendall(reply(caller.ports[1], "one"))
            assert answer(fault.next) == 2
        else:
            fault.old.close()
            assert answer(fault.next) == 1
            fault.next.sendall(reply(caller.ports[1], "one"))
        assert caller.calls[1].get(timeout=20) == "one"
        assert mesh.release.call_one().get(timeout=20) == "released"
        # Closed here as replaced: its end was not seen here before the next hello.
        wait_until(lambda: replaced.closed, 10, "the replaced connection to be closed here")
        assert "replaced it before it was told" in str(replaced.close_reason), replaced.close_reason
    finally:
        fault.close()
        caller.end()


def test_a_hello_read_in_the_turn_that_read_its_previous_connections_ends_is_answered_exactly(
    gate: tuple[Any, str],
) -> None:
    """The old connection and the dropped replacement end at the worker's end, and this
    process's loop reads both ends and the next hello in one turn (it reads every ready
    connection of an address in one callback), before the ends' reports run: the next
    connection is told 1, sends the second reply again, and both calls get their values
    once. (It was told "unknown": the old connection, closed, could not be waited behind.)"""
    mesh, worker = gate
    caller = CallingThread()
    caller.call(mesh, worker, 2)
    fault = TripleFault(worker, caller)
    try:
        conns = on_loop(lambda: incoming(caller.address))
        entered, go = threading.Event(), threading.Event()

        def one_turn() -> None:
            """(the runtime loop) Read the three connections once the worker is done with them."""
            entered.set()
            assert go.wait(10)
            for conn, reader in conns.items():  # in the order they were accepted: old first
                reader.read(True)
                assert conn.closed or conn.peer is not None

        async def run() -> None:
            one_turn()

        turn = asyncio.run_coroutine_threadsafe(run(), runtime().loop)
        assert entered.wait(10)
        fault.old.close()
        fault.dropped.close()
        fault.next.sendall(fault.next_hello)
        go.set()
        turn.result(10)
        assert answer(fault.next) == 1
        fault.next.sendall(reply(caller.ports[1], "one"))
        assert caller.calls[1].get(timeout=20) == "one"
        assert mesh.release.call_one().get(timeout=20) == "released"
    finally:
        fault.close()
        caller.end()


@pytest.mark.parametrize("old", ["delivers", "ends", "ended-first"])
def test_a_question_asked_again_after_a_hello_never_read_here_is_answered_exactly(
    gate: tuple[Any, str], old: str
) -> None:
    """The worker's replacement connection was authenticated, but its hello never came here
    (lost in a reset): the next connection asks again what it asked, naming the old connection,
    which this process still takes for the worker's previous one. It waits behind the old one,
    and is told 2 once that one delivered the second reply, or 1 once it ended without it (then
    it sends that reply again); or 1 at once if the old one had ended first. Each call gets its
    value once. (Asked about the replacement, "0 frames written", this process answered 0: the
    worker would have sent the first reply again, and a message read here would have run
    twice.)"""
    mesh, worker = gate
    caller = CallingThread()
    caller.call(mesh, worker, 2)
    address, link = caller.address, (worker, caller.address)
    first = authenticated_connection(address, nonce=OLD)
    try:
        first.sendall(hello(worker) + reply(caller.ports[0], "zero"))
        assert caller.calls[0].get(timeout=20) == "zero"
        authenticated_connection(address).close()  # the replacement: its hello never comes
        if old == "ended-first":
            first.close()
            wait_until(lambda: on_loop(lambda: link in runtime()._drops), 10, "the old connection's end")
        with authenticated_connection(address) as nxt:
            nxt.sendall(hello(worker, (2, 0, [[0, caller.ports[0]], [1, caller.ports[1]]], [], 0), OLD))
            if old == "delivers":
                wait_until(lambda: on_loop(lambda: waiting_behind(address)), 10, "the wait behind")
                first.sendall(reply(caller.ports[1], "one"))
                assert answer(nxt) == 2
            else:
                if old == "ends":
                    wait_until(lambda: on_loop(lambda: waiting_behind(address)), 10, "the wait behind")
                    first.close()
                assert answer(nxt) == 1
                nxt.sendall(reply(caller.ports[1], "one"))
            assert caller.calls[1].get(timeout=20) == "one"
            assert mesh.release.call_one().get(timeout=20) == "released"
    finally:
        first.close()
        caller.end()


@pytest.mark.parametrize("dropped_end_seen", [False, True], ids=["dropped-open", "dropped-ended"])
def test_a_question_asked_again_after_its_answer_was_lost_is_told_the_same(
    gate: tuple[Any, str], dropped_end_seen: bool
) -> None:
    """The replacement was told what was read (2: the old connection delivered both replies),
    but dropped before the worker heard it: the next connection asks again, and is told the
    same at once; nothing is settled twice, no call fails, and the replacement is closed here
    as replaced (else, its end not seen here, it would be taken for a drop to settle later).
    Asked about the old connection as if new, this process would wait for frames the
    replacement never carries, and report what it lost again."""
    mesh, worker = gate
    caller = CallingThread()
    caller.call(mesh, worker, 2)
    address, link = caller.address, (worker, caller.address)
    said = (2, 0, [[0, caller.ports[0]], [1, caller.ports[1]]], [], 0)
    first = authenticated_connection(address, nonce=OLD)
    dropped = authenticated_connection(address)
    try:
        first.sendall(hello(worker) + reply(caller.ports[0], "zero"))
        assert caller.calls[0].get(timeout=20) == "zero"
        dropped.sendall(hello(worker, said, OLD))
        wait_until(lambda: on_loop(lambda: waiting_behind(address)), 10, "the wait behind")
        first.sendall(reply(caller.ports[1], "one"))
        assert answer(dropped) == 2  # (the worker never hears it)
        assert caller.calls[1].get(timeout=20) == "one"
        (replaced,) = on_loop(lambda: [c for c in incoming(address) if c.peer and c.asked_about == OLD])
        if dropped_end_seen:
            dropped.close()
            wait_until(lambda: on_loop(lambda: link in runtime()._drops), 10, "the replacement's end")
        with authenticated_connection(address) as nxt:
            nxt.sendall(hello(worker, said, OLD))
            assert answer(nxt) == 2
            assert on_loop(lambda: link not in runtime()._drops)  # the replacement's, if seen
            first.close()  # settled with both replies read: no call fails
            assert mesh.release.call_one().get(timeout=20) == "released"
            assert mesh.wait.call_one().get(timeout=20) == "done"
        if not dropped_end_seen:
            wait_until(lambda: replaced.closed, 10, "the replaced connection to be closed here")
            assert "replaced it before it was told" in str(replaced.close_reason), replaced.close_reason
    finally:
        first.close()
        dropped.close()
        caller.end()
