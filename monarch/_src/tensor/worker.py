"""The tensor engine's half on each proc: a table of local tensors, filled by ops run in issue order.

One ``TensorWorker`` actor per proc of an activated mesh receives the controller's batches of
commands and runs them one after another on its own thread (a sync actor, so a collective or
a wait on an ``rref`` result never blocks the proc's event loop). Every value an op produces
is stored under the id the controller gave its handle; an op that raises stores a
``RemoteException`` under its result ids instead, and an op reading such a result fails the
same way without running, so an error shows wherever an affected tensor is fetched while
independent tensors stay usable.

Actors of the same proc see the worker's table through ``local_shard``: a distributed tensor
pickled into an endpoint call arrives as that proc's shard, lent to the actor until its
endpoint ends; the worker runs no later op until then, so the actor sees exactly the ops
issued before its call, and ops issued after it never run beside its use of the shard.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from monarch._src.actor.actor import Actor
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.instance import decoding_scratch, may_still_run, when_message_done
from monarch._src.actor.process_state import runtime, this_process
from monarch._src.actor.unpickle_off_loop import unpickling_may_wait
from monarch._src.runtime.config import CONFIG

#: How long a reader waits for a value that an op not yet run will produce (an ``rref`` whose
#: endpoint is still running, a shard unpickled before the worker got to its op).
VALUE_WAIT_S = 300.0
#: How often a worker waiting for lent shards checks that the actor they went to still lives
#: (an actor that failed or stopped before it ran the call never gives them back).
LENT_CHECK_S = 1.0


class RemoteException(Exception):
    """An op of the tensor engine failed on a proc; the message carries the remote traceback.

    Every tensor computed from the op's results fails with the same exception when fetched.
    """

    def __init__(self, message: str, op: str = "", rank: int = -1) -> None:
        super().__init__(message)
        self.op = op
        self.rank = rank

    def __reduce__(self) -> Any:
        return (RemoteException, (self.args[0], self.op, self.rank))


class Ref:
    """A distributed tensor inside a shipped op's arguments: the id of its local value."""

    __slots__ = ("id",)

    def __init__(self, ref_id: int) -> None:
        self.id = ref_id

    def __reduce__(self) -> Any:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class Table:
    """The values of one controller's tensors on this proc, by id; readers may wait for one."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.values: dict[int, Any] = {}
        self.failed: dict[int, RemoteException] = {}
        self.changed = threading.Condition()
        #: Batches of commands run so far (an actor given a shard waits for its call's turn).
        self.batches_run = 0
        #: Values pinned for actors that messages carry them to, with when they were pinned.
        self.pinned: dict[int, float] = {}
        #: Pins lent to an endpoint call, by the key of the actor it goes to, until it ends.
        self.lent: dict[int, str] = {}
        #: How many batches the actor a pin went to waits for (``local_shard``), once it said:
        #: those were sent before its call, so a lent pin never holds them back. Unknown until
        #: then (the pin holds back every later batch meanwhile).
        self.needed: dict[int, int] = {}
        #: Whether the worker holds back a batch until lent pins are given back (diagnostics:
        #: an actor can see that the ops issued after its call wait for it).
        self.holding_back = False

    def store(self, ref_id: int, value: Any) -> None:
        with self.changed:
            self.values[ref_id] = value
            self.failed.pop(ref_id, None)
            self.changed.notify_all()

    def fail(self, ref_id: int, error: RemoteException) -> None:
        with self.changed:
            self.values.pop(ref_id, None)
            self.failed[ref_id] = error
            self.changed.notify_all()

    def pin(self, ref_id: int, pin_id: int) -> None:
        """Keep ``ref_id``'s value (or failure) under ``pin_id`` too, for the actor a message
        carries it to: the sender may free its handle before that actor takes it."""
        with self.changed:
            if ref_id in self.values:
                self.values[pin_id] = self.values[ref_id]
            elif ref_id in self.failed:
                self.failed[pin_id] = self.failed[ref_id]
            self.pinned[pin_id] = time.monotonic()
            self.changed.notify_all()

    def give_back(self, pin_id: int) -> None:
        """The endpoint a pin was lent to ended: later ops may run."""
        with self.changed:
            self.needed.pop(pin_id, None)
            if self.lent.pop(pin_id, None) is not None:
                self.changed.notify_all()

    def wait_batches_for(self, pins: list[int], n: int, wait_s: float) -> bool:
        """``wait_batches(n)`` for the message that takes ``pins``: the batches it waits for
        were sent before its call (more than a pin's own: the frees of other meshes sent with
        it, the pin of its next tensor), so its lent pins must not hold them back (see
        ``wait_for_lent``)."""
        with self.changed:
            for pin_id in pins:
                self.needed[pin_id] = max(self.needed.get(pin_id, 0), n)
            self.changed.notify_all()
        return self.wait_batches(n, wait_s)

    def _holding_back(self) -> list[int]:
        """(lock held) The lent pins that hold back the next batch: those whose actor may
        still run and does not wait for that batch (or has not said yet what it waits for)."""
        upto = self.batches_run
        for pin_id, key in list(self.lent.items()):
            if not may_still_run(key):
                del self.lent[pin_id]
                self.needed.pop(pin_id, None)
        return [p for p in self.lent if self.needed.get(p, upto) <= upto]  # (unknown: held back)

    def wait_for_lent(self, wait_s: float) -> list[str] | None:
        """Wait until every endpoint lent a pin ended (or its actor can no longer run it, or
        waits for this batch itself); after ``wait_s``, stop waiting and return the keys of
        the actors still holding them."""
        deadline = time.monotonic() + wait_s
        with self.changed:
            self.holding_back = True
            try:
                while True:
                    holding = self._holding_back()
                    if not holding:
                        return None
                    left = deadline - time.monotonic()
                    if left <= 0:
                        keys = sorted({self.lent[p] for p in holding})
                        for p in holding:
                            del self.lent[p]
                        return keys
                    self.changed.wait(min(left, LENT_CHECK_S))
            finally:
                self.holding_back = False

    def take(self, pin_id: int) -> Any:
        """The pinned value, given up (an actor takes it once, as one message reaches one
        actor per proc); raises its ``RemoteException``."""
        with self.changed:
            self.pinned.pop(pin_id, None)
            if pin_id not in self.lent:  # (a lent pin's is dropped when it is given back)
                self.needed.pop(pin_id, None)
            value = self.values.pop(pin_id, _MISSING)
            if value is not _MISSING:
                return value
            err = self.failed.pop(pin_id, None)
        if err is not None:
            raise err
        raise KeyError(pin_id)

    def sweep_pins(self) -> None:
        """Forget pins no actor took (the message reached no actor on this proc) in ``VALUE_WAIT_S``."""
        stale = time.monotonic() - VALUE_WAIT_S
        old = [i for i, at in self.pinned.items() if at < stale]
        for i in old:
            del self.pinned[i]
        self.delete(old)

    def delete(self, ids: list[int]) -> None:
        values, failed = self.values, self.failed
        for i in ids:
            values.pop(i, None)
            failed.pop(i, None)

    def batch_done(self) -> None:
        with self.changed:
            self.batches_run += 1
            self.changed.notify_all()

    def wait_batches(self, n: int, wait_s: float) -> bool:
        """Wait until ``n`` batches ran; False if they did not within ``wait_s``."""
        with self.changed:
            return self.changed.wait_for(lambda: self.batches_run >= n, wait_s)

    def get(self, ref_id: int, wait_s: float = 0.0) -> Any:
        """The value of ``ref_id``; raises its ``RemoteException``, or ``KeyError`` after ``wait_s``."""
        value = self.values.get(ref_id, _MISSING)
        if value is not _MISSING:
            return value
        deadline = time.monotonic() + wait_s
        with self.changed:
            while True:
                value = self.values.get(ref_id, _MISSING)
                if value is not _MISSING:
                    return value
                err = self.failed.get(ref_id)
                if err is not None:
                    raise err
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KeyError(ref_id)
                self.changed.wait(left)

    def __len__(self) -> int:
        return len(self.values) + len(self.failed)


_MISSING = object()

#: The first item of a pin command (see ``Table.pin``).
PIN = "pin"

#: This proc's tables, by controller key (one per client that activated a mesh holding it).
tables: dict[str, Table] = {}

_running = threading.local()


def root_rank() -> int:
    """Inside an op: this proc's rank in the root mesh (its rank in the engine's process group)."""
    return _running.rank


def local_shard(controller_key: str, pin_id: int, batches: dict[int, int]) -> Any:
    """What a distributed tensor unpickles to in an actor: this proc's value of it (pinned for
    the message under ``pin_id``), once the proc's worker ran the ``batches`` sent to it before
    the tensor was."""
    table = tables.get(controller_key)
    if table is None:
        raise RuntimeError(
            "a distributed tensor was sent to an actor on a proc outside the tensor's mesh\n"
            "HINT: pass it only to actors spawned on the procs of the mesh it lives on, or move "
            "it first with monarch.to_mesh."
        )
    scratch = decoding_scratch()
    pins = [] if scratch is None else scratch.setdefault("tensor_pins", [])
    pins.append(pin_id)
    if not table.wait_batches_for(pins, batches.get(table.rank, 0), VALUE_WAIT_S):
        raise RuntimeError(
            f"the tensor ops issued before this call did not run on rank {table.rank} within "
            f"{VALUE_WAIT_S:.0f} s, so this distributed tensor argument has no value\n"
            "HINT: an earlier op may still be running there, or an endpoint call given a shard of "
            "this proc may not have returned (ops issued after it wait for it, see "
            "MONARCH_TENSOR_LEND_TIMEOUT_S); make such an endpoint return sooner."
        )
    if pin_id in table.lent and not when_message_done(lambda: table.give_back(pin_id)):
        table.give_back(pin_id)  # not unpickled as a message's argument: nothing to wait for
    try:
        return table.take(pin_id)
    except KeyError:
        raise RuntimeError(
            "a distributed tensor reached this actor twice, or after it was given up (an actor of "
            "another mesh on this proc took it)"
        ) from None


def resolve(value: Any, table: Table) -> Any:
    """``value`` with every ``Ref`` replaced by its local tensor (tuples, lists, dicts walked)."""
    if type(value) is Ref:
        return table.get(value.id, VALUE_WAIT_S)
    if type(value) in (tuple, list):
        return type(value)(resolve(v, table) for v in value)
    if type(value) is dict:
        return {k: resolve(v, table) for k, v in value.items()}
    return value


def tensor_leaves(value: Any) -> list[Any]:
    """The tensors in an op's result, in the order the controller numbered its handles."""
    import torch
    from torch.utils import _pytree as pytree

    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def op_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


class TensorWorker(Actor):
    """Runs one controller's ops on this proc, in the order they were issued."""

    def __init__(self, controller_key: str, root_addresses: tuple[str, ...]) -> None:
        address = self.address = runtime().address
        self.rank = root_addresses.index(address)
        self.root_addresses = root_addresses
        # From now on ``local_shard`` may wait in this process (it needs the table): an async
        # actor's message carrying a distributed tensor is unpickled off the event loop, so its
        # wait stalls neither the loop nor a running call holding a shard it waits for.
        unpickling_may_wait(local_shard)
        self.table = tables[controller_key] = Table(self.rank)
        self.controller_key = controller_key
        self.batches = 0

    @endpoint
    def run(self, commands: list[tuple]) -> None:
        """Run a batch: ``(fn, args, kwargs, result ids)`` ops, ``(None, ids)`` frees, and
        ``(PIN, id, pin id, lent to)`` pins of a value a message carries to an actor; ``lent to``
        is the (actor key, process addresses) of an endpoint call, None for other messages."""
        table = self.table
        self.batches += 1
        _running.rank = self.rank
        late = self.wait_for_lent() if table.lent else None
        try:
            for command in commands:
                fn = command[0]
                if fn is None:
                    table.delete(command[1])
                elif fn == PIN:
                    self.pin(command[1], command[2], command[3])
                elif late is not None:
                    for i in command[3]:
                        table.fail(i, late)
                else:
                    self.run_op(fn, command[1], command[2], command[3])
        finally:  # even a batch that stopped short lets the actors waiting for it go on
            table.batch_done()
        if table.pinned:
            table.sweep_pins()

    def pin(self, ref_id: int, pin_id: int, lent_to: tuple[str, frozenset[str]] | None) -> None:
        if lent_to is None:
            self.table.pin(ref_id, pin_id)
        elif self.address in lent_to[1]:  # the call comes to this proc: lend until it ends
            self.table.pin(ref_id, pin_id)
            self.table.lent[pin_id] = lent_to[0]

    def wait_for_lent(self) -> RemoteException | None:
        """Wait for the endpoints lent shards to end; the error for this batch's ops if they
        did not within the ``tensor_lend_timeout_s`` setting."""
        wait_s = CONFIG.tensor_lend_timeout_s
        keys = self.table.wait_for_lent(wait_s)
        if keys is None:
            return None
        holders = ", ".join(getattr(this_process.lookup(k), "name", k) for k in keys)
        return RemoteException(
            f"tensor ops issued after an endpoint call to actor {holders}, which was given a "
            f"distributed tensor, did not run on rank {self.rank}: the endpoint still held the "
            f"tensor's shard after {wait_s:g} s, and they must not run beside it\n"
            "HINT: return from the endpoint sooner; an actor that needs the value longer keeps a copy "
            "(shard.clone()).",
            "order",
            self.rank,
        )

    def run_op(self, fn: Callable[..., Any], args: tuple, kwargs: dict, result_ids: list[int]) -> None:
        table = self.table
        try:
            result = fn(*resolve(args, table), **resolve(kwargs, table))
        except RemoteException as e:  # an input had failed: its results fail the same way
            for i in result_ids:
                table.fail(i, e)
            return
        except Exception:
            error = RemoteException(
                f"{op_name(fn)} failed on rank {self.rank}:\n{traceback.format_exc()}", op_name(fn), self.rank
            )
            for i in result_ids:
                table.fail(i, error)
            return
        if not result_ids:
            return
        leaves = tensor_leaves(result)
        if len(leaves) != len(result_ids):
            error = RemoteException(
                f"{op_name(fn)} returned {len(leaves)} tensors on rank {self.rank}, where the "
                f"controller expected {len(result_ids)} (its propagate function disagrees with it)",
                op_name(fn),
                self.rank,
            )
            for i in result_ids:
                table.fail(i, error)
            return
        for i, leaf in zip(result_ids, leaves):
            table.store(i, leaf)

    @endpoint
    def fetch(self, ids: list[int]) -> list[tuple[bool, Any]]:
        """The CPU value of each id, as ``(True, tensor)`` or ``(False, RemoteException)``."""
        out: list[tuple[bool, Any]] = []
        for i in ids:
            try:
                value = self.table.get(i, VALUE_WAIT_S)
            except RemoteException as e:
                out.append((False, e))
                continue
            except KeyError:
                out.append(
                    (False, RemoteException(f"tensor {i} is not on rank {self.rank}", "fetch", self.rank))
                )
                continue
            out.append((True, value.detach().cpu() if hasattr(value, "detach") else value))
        return out

    @endpoint
    def call_function(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run a free remote function here (``remote(fn).call()`` and the other adverbs)."""
        return fn(*resolve(args, self.table), **resolve(kwargs, self.table))

    @endpoint
    def stats(self) -> dict[str, int]:
        """How many values (and failures) this proc holds (freed handles must shrink it), and how
        many batches it ran (ops travel many to a message)."""
        return {"values": len(self.table), "batches": self.batches}

    def __cleanup__(self, exc: BaseException | None) -> None:
        tables.pop(self.controller_key, None)
