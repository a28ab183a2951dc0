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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from actors import Gate
from fault_helpers import Probe, authenticated_connection, worker_log

from monarch._src.actor import port
from monarch._src.actor.process_state import runtime
from monarch._src.transport import read_count
from monarch._src.wire.frame import encode_frame
from monarch._src.wire.protocol import peer_hello
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
        raw.sendall(b"".join(bytes(b) for b in encode_frame(peer_hello(sender, previous), [], 1 << 30)))
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
