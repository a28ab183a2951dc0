"""An async actor's distributed-tensor arguments, and distributed tensors sent to a port, are
waited for off the event loop.

Unpickling a distributed tensor waits until the proc's tensor worker ran the ops issued before
the call; those may be held back by a shard lent to a call still running (see
``test_endpoint_order``). An async actor runs on the proc's event loop, so that wait must not
block the loop: the call holding the shard, other actors of the proc and every reply go on
meanwhile. Here a call holding a shard waits for a gate that another actor of its proc opens,
while a later call's (or a port value's) tensor waits for ops that the held shard holds back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import monarch
from monarch.actor import (
    Actor,
    ActorMesh,
    Channel,
    Future,
    Port,
    PortReceiver,
    ProcMesh,
    concurrent_endpoint,
    endpoint,
)

pytestmark = pytest.mark.timeout(60)

#: How long the proc's loop may take to answer: far under the 300 s a blocked decode waits.
ANSWER_S = 10.0


class Gate(Actor):
    """Opened by a call of its own: what a call holding a shard waits for."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()

    @concurrent_endpoint
    async def wait(self) -> None:
        await self.opened.wait()

    @endpoint
    async def open(self) -> None:
        self.opened.set()

    @endpoint
    async def ping(self) -> str:
        return "pong"


class AsyncHolder(Actor):
    def __init__(self, gate: ActorMesh[Gate]) -> None:
        self.gate = gate

    @concurrent_endpoint
    async def hold(self, x: torch.Tensor) -> list:
        """The shard as the call got it, after the gate opened (the shard is lent until then)."""
        seen = x.tolist()
        await self.gate.wait.call_one()
        return seen

    @endpoint
    async def hold_in_turn(self, x: torch.Tensor) -> list:
        """``hold`` as an ordinary endpoint: its actor runs nothing else until it returns."""
        seen = x.tolist()
        await self.gate.wait.call_one()
        return seen

    @concurrent_endpoint
    async def read(self, x: torch.Tensor) -> list:
        return x.tolist()

    @endpoint
    async def read_in_turn(self, x: torch.Tensor) -> list:
        return x.tolist()

    @endpoint
    async def echo(self, value: int) -> int:
        return value


class Inbox(Actor):
    """Channels into its proc, read by concurrent calls (so several may wait at once)."""

    def __init__(self) -> None:
        self.ports: dict[str, Port[Any]] = {}
        self.receivers: dict[str, PortReceiver[Any]] = {}

    @endpoint
    async def open(self, name: str) -> Port[Any]:
        self.ports[name], self.receivers[name] = Channel.open()
        return self.ports[name]

    @endpoint
    async def send_here(self, name: str, value: Any) -> None:
        """Send ``value`` to channel ``name`` from this proc."""
        self.ports[name].send(value)

    @concurrent_endpoint
    async def receive(self, name: str, count: int) -> list:
        """The next ``count`` values sent to channel ``name``, in the order received (a tensor
        as its list; an exception that a value raised, as its message)."""
        values: list = []
        for _ in range(count):
            try:
                value = await self.receivers[name].recv()
            except Exception as e:
                values.append(str(e))
                continue
            values.append(value.tolist() if isinstance(value, torch.Tensor) else value)
        return values


@pytest.fixture
def one(procs: ProcMesh) -> Iterator[ProcMesh]:
    """One proc of the module's mesh, where every actor of a test lives (one event loop)."""
    yield procs.slice(gpus=0)


@pytest.fixture
def gate(one: ProcMesh) -> ActorMesh[Gate]:
    return one.spawn("gate", Gate)


def _changed_behind_a_held_shard(one: ProcMesh, hold: Any) -> tuple[Future, torch.Tensor]:
    """``hold(x)``, lent x's shard until the gate opens; ``x.add_(1)``, issued after it and so
    held back until then: the call, and x (whose value waits for that op)."""
    with one.activate():
        x = torch.zeros(2)
    held = hold.call_one(x)
    with one.activate():
        x.add_(1)
    return held, x


def _read_behind_a_held_shard(one: ProcMesh, hold: Any, read: Any) -> tuple[Future, Future]:
    """``read(x)`` behind ``hold(x)`` (``_changed_behind_a_held_shard``): the two calls."""
    held, x = _changed_behind_a_held_shard(one, hold)
    return held, read.call_one(x)


def _open_and_check(gate: ActorMesh[Gate], held: Future, read: Future) -> None:
    """Open the gate: the holding call ends having seen x before the op, then the reading call
    sees x after it."""
    gate.open.call_one().get(timeout=ANSWER_S)
    assert held.get(timeout=ANSWER_S) == [0.0, 0.0]
    assert read.get(timeout=ANSWER_S) == [1.0, 1.0]


def test_a_concurrent_call_holding_a_shard_ends_while_a_later_tensor_waits(one, gate) -> None:
    holder = one.spawn("async_holder", AsyncHolder, gate)
    held, read = _read_behind_a_held_shard(one, holder.hold, holder.read)
    assert gate.ping.call_one().get(timeout=ANSWER_S) == "pong"  # the proc's loop answers meanwhile
    assert not read.done()
    _open_and_check(gate, held, read)


def test_a_shard_held_by_another_async_actor_blocks_no_loop(one, gate) -> None:
    holder = one.spawn("async_holder_in_turn", AsyncHolder, gate)
    reader = one.spawn("async_reader", AsyncHolder, gate)
    held, read = _read_behind_a_held_shard(one, holder.hold_in_turn, reader.read_in_turn)
    assert gate.ping.call_one().get(timeout=ANSWER_S) == "pong"
    assert not read.done()
    _open_and_check(gate, held, read)


def test_a_later_call_starts_after_the_tensor_call_before_it(one, gate) -> None:
    """The mailbox's start order holds while a tensor waits: the call behind it waits too."""
    holder = one.spawn("async_holder_order", AsyncHolder, gate)
    held, read = _read_behind_a_held_shard(one, holder.hold, holder.read)
    after = holder.echo.call_one(7)
    assert gate.ping.call_one().get(timeout=ANSWER_S) == "pong"
    assert not after.done()  # behind read, whose tensor still waits
    _open_and_check(gate, held, read)
    assert after.get(timeout=ANSWER_S) == 7


def test_a_tensor_that_cannot_be_taken_fails_the_async_call(procs, one, gate) -> None:
    holder = one.spawn("async_holder_wrong_proc", AsyncHolder, gate)
    with procs.slice(gpus=1).activate():
        elsewhere = torch.zeros(2)  # pinned on gpus=1 only
    with pytest.raises(Exception, match="a distributed tensor reached this actor twice"):
        holder.read.call_one(elsewhere).get(timeout=ANSWER_S)
    with one.activate():
        x = torch.ones(2)
    assert holder.read.call_one(x).get(timeout=ANSWER_S) == [1.0, 1.0]  # the actor goes on
    assert monarch.inspect(x).tolist() == [1.0, 1.0]


def test_a_tensor_sent_to_a_port_waits_off_the_loop(one, gate) -> None:
    """The proc's loop answers while the value waits; values sent to the same port after it,
    from another proc or its own, are received after it; values to another port of the proc
    are not held behind it."""
    holder = one.spawn("async_holder_port", AsyncHolder, gate)
    inbox = one.spawn("inbox", Inbox)
    port = inbox.open.call_one("tensors").get(timeout=ANSWER_S)
    held, x = _changed_behind_a_held_shard(one, holder.hold)
    port.send(x)
    port.send(7)
    inbox.send_here.call_one("tensors", 8).get(timeout=ANSWER_S)  # (a value sent as it is)
    received = inbox.receive.call_one("tensors", 3)
    other = inbox.open.call_one("plain").get(timeout=ANSWER_S)
    other.send(3)
    assert inbox.receive.call_one("plain", 1).get(timeout=ANSWER_S) == [3]
    assert gate.ping.call_one().get(timeout=ANSWER_S) == "pong"
    assert not received.done()  # the tensor still waits, and 7 and 8 behind it
    gate.open.call_one().get(timeout=ANSWER_S)
    assert held.get(timeout=ANSWER_S) == [0.0, 0.0]
    assert received.get(timeout=ANSWER_S) == [[1.0, 1.0], 7, 8]


def test_a_port_value_that_cannot_be_unpickled_is_received_as_an_error(procs, one) -> None:
    """A tensor the proc cannot take reaches the receiver as an error, and the port goes on."""
    inbox = one.spawn("inbox_error", Inbox)
    port = inbox.open.call_one("errors").get(timeout=ANSWER_S)
    with procs.slice(gpus=1).activate():
        elsewhere = torch.zeros(2)  # pinned on gpus=1 only
    port.send(elsewhere)
    port.send(5)
    first, second = inbox.receive.call_one("errors", 2).get(timeout=ANSWER_S)
    assert "could not be unpickled" in first and second == 5
