"""The multi-node rendezvous: one launcher per node agrees on ranks, rounds and the job's end.

torchrun's launchers meet in a TCPStore (c10d: at ``--rdzv-endpoint``, hosted by whichever
launcher can bind it; static: at ``--master-addr:--master-port``, hosted by node rank 0).
Ours do too, and the store speaks the same protocol (:mod:`.store`, :mod:`.store_client`),
but the keys are our own: what must equal torchrun's is the result (group ranks, global
ranks, ``MASTER_ADDR``/``MASTER_PORT``), not the bookkeeping. Keys live under
``/monarch.launch/<run id>/``:

* ``r<N>/joined`` (a counter) and ``r<N>/node/<slot>`` (a node's descriptor): joining round N.
  The first node to join a round closes it (``r<N>/closed``) once ``MAX`` nodes joined, or
  ``MIN`` nodes and then ``last_call_timeout`` passed; nodes that join a closed round wait
  for the next one, and a closed round smaller than ``MAX`` is ended (``reason: joined``)
  so that they get in at once, as torchrun restarts a group for a new node.
* Group ranks sort the members the way torchrun sorts its node descriptors: by
  ``(address, pid)`` for c10d, by ``--node-rank`` for static.
* ``r<N>/master``: where the workers' store is (c10d: a fresh one on group rank 0 per round;
  static: the rendezvous store itself, emptied of the last round's worker keys).
* ``r<N>/end``: how the round ended, written once (compare-and-set) by whoever first knows:
  a node whose worker failed (with the failure), the last node to succeed, a node that stopped
  hearing another's heartbeat (``r<N>/hb/<group rank>``), a node stopped by a signal, or a
  new node. Every launcher waits on this key, so a failure anywhere stops every node's
  workers within one store round trip; that is where we do better than torchrun, whose other
  nodes keep running until the exit barrier or the collective's own timeout.

Restarts are counted for the job: round N+1's ``restart_count`` is round N's plus one when
round N ended in a failure, so every node sees the same ``TORCHELASTIC_RESTART_COUNT`` and the
``--max-restarts`` budget is the job's (torchrun counts per node, pytorch/pytorch#108158).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .config import LaunchConfig
from .store import StoreServer
from .store_client import StoreClient, StoreGone, connect

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "HEARTBEAT_MISSES",
    "JobRendezvous",
    "NodeInfo",
    "RendezvousError",
    "RendezvousInterrupted",
    "Round",
    "RoundEnded",
    "RoundWatch",
]

#: Our defaults for torchrun's ``keep_alive_interval``/``keep_alive_max_attempt``: a node
#: whose launcher died is noticed within ``interval * misses`` (+ one interval) seconds.
#: torchrun's 5 s x 3 would take 15 s; both are ``--rdzv-conf`` keys.
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_MISSES = 3

#: End reasons that use up a restart.
FAILURE_REASONS = ("failed", "node_lost")


class RendezvousError(RuntimeError):
    """The nodes could not form (or keep) a job; the message says which and what to do."""


class RendezvousInterrupted(Exception):
    """A signal reached the launcher while it waited for the other nodes."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum} during the rendezvous")
        self.signum = signum


@dataclass(frozen=True)
class NodeInfo:
    """One launcher, as the others see it."""

    addr: str
    pid: int
    nproc: int
    role: str
    host: str
    node_rank: int
    #: this launcher hosts the rendezvous store (the job ends with it).
    store_host: bool = False


@dataclass(frozen=True)
class Round:
    """A closed rendezvous round, as seen by one member."""

    index: int
    group_rank: int
    nodes: tuple[NodeInfo, ...]
    restart_count: int
    master_addr: str
    master_port: int

    @property
    def group_world_size(self) -> int:
        return len(self.nodes)

    @property
    def rank_offset(self) -> int:
        return self.offset_of(self.group_rank)

    def offset_of(self, group_rank: int) -> int:
        """The global rank of local rank 0 on node ``group_rank``."""
        return sum(n.nproc for n in self.nodes[:group_rank])

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    @property
    def role_rank_offset(self) -> int:
        role = self.nodes[self.group_rank].role
        return sum(n.nproc for n in self.nodes[: self.group_rank] if n.role == role)

    @property
    def role_world_size(self) -> int:
        role = self.nodes[self.group_rank].role
        return sum(n.nproc for n in self.nodes if n.role == role)


@dataclass(frozen=True)
class RoundEnded:
    """The agent's event: round ``index`` ended; ``record`` is the ``r<N>/end`` value."""

    index: int
    record: dict[str, Any]

    @property
    def reason(self) -> str:
        return str(self.record.get("reason", ""))


@dataclass(frozen=True)
class _Settings:
    join_timeout: float
    last_call_timeout: float
    close_timeout: float
    read_timeout: float
    keep_alive_interval: float
    keep_alive_max_attempt: int
    is_host: bool | None

    @classmethod
    def of(cls, config: LaunchConfig) -> _Settings:
        def seconds(key: str, default: float) -> float:
            value = config.rdzv_configs.get(key)
            return default if value is None else float(value)

        # The static backend has one bound for the whole rendezvous: torchrun's `timeout`.
        join_key = "timeout" if config.rdzv_backend == "static" else "join_timeout"
        return cls(
            join_timeout=seconds(join_key, 600),
            last_call_timeout=seconds("last_call_timeout", 30),
            close_timeout=seconds("close_timeout", 30),
            read_timeout=seconds("read_timeout", 60),
            keep_alive_interval=seconds("keep_alive_interval", HEARTBEAT_INTERVAL_S),
            keep_alive_max_attempt=int(seconds("keep_alive_max_attempt", HEARTBEAT_MISSES)),
            is_host=config.rdzv_bool("is_host"),
        )


def _dumps(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


class JobRendezvous:
    """This launcher's side of the job's rendezvous: hosting or joining the store, rounds,
    and publishing how a round ended. Used by the agent's thread; :class:`RoundWatch`
    threads use connections of their own.

    :param host_worker_store: called on group rank 0 of a c10d round: starts the workers'
        store and returns its ``(addr, port)``.
    """

    def __init__(
        self,
        config: LaunchConfig,
        log: logging.Logger,
        host_worker_store: Callable[[], tuple[str, int]],
    ) -> None:
        self.config = config
        self.log = log
        self.settings = _Settings.of(config)
        self.prefix = f"/monarch.launch/{config.rdzv_id}/"
        self.host_worker_store = host_worker_store
        self.static = config.rdzv_backend == "static"
        if self.static:
            self.store_host, self.store_port = config.master_addr, config.master_port
        else:
            self.store_host, self.store_port = config.rdzv_host, config.rdzv_port
        #: This node's name (a reverse lookup, done once: never on the way to report a failure).
        self.host = socket.getfqdn()
        self.addr = config.local_addr or self.host
        self.server: StoreServer | None = None
        self.client: StoreClient | None = None
        self.round: Round | None = None
        self._interrupted: int | None = None
        self._waiting: StoreClient | None = None

    def interrupt(self, signum: int) -> None:
        """Abandon the rendezvous: a wait in progress (and every later one) raises
        :class:`RendezvousInterrupted`. Safe in a signal handler: the main thread may be
        blocked in that very wait, which the kernel does not end for a handled signal."""
        self._interrupted = signum
        waiting = self._waiting
        if waiting is not None:
            waiting.close()

    def _check_interrupted(self) -> None:
        if self._interrupted is not None:
            raise RendezvousInterrupted(self._interrupted)

    # -- the store ------------------------------------------------------------------------------

    def open(self) -> JobRendezvous:
        """Host the store if this launcher should and can, then connect to it."""
        if self.static:
            if self.config.node_rank == 0:
                self.server = self._bind(required=True)
        elif self.settings.is_host is not False:
            self.server = self._bind(required=bool(self.settings.is_host))
        if self.server is not None:
            self.log.info("hosting the rendezvous store on %s:%s", self.store_host, self.store_port)
        self.client = self._connect(retry_for=self.settings.join_timeout)
        self._check_interrupted()
        return self

    def _bind(self, required: bool) -> StoreServer | None:
        try:
            return StoreServer(self.store_host, self.store_port).start()
        except OSError as err:
            if required:
                raise RendezvousError(
                    f"cannot host the rendezvous store on {self.store_host}:{self.store_port}: {err}\n"
                    "HINT: node rank 0 (static) or is_host=1 (c10d) must be able to listen on that "
                    "address; is another job using the port?"
                ) from None
            return None  # another launcher has it, or the address is not ours: join it

    def _connect(self, retry_for: float = 0.0) -> StoreClient:
        try:
            return connect(
                self.store_host,
                self.store_port,
                timeout=self.settings.read_timeout,
                retry_for=retry_for,
                give_up=lambda: self._interrupted is not None,
            )
        except StoreGone as err:
            self._check_interrupted()
            raise RendezvousError(
                f"{err}\nHINT: start the launcher of node rank 0 (static) or the one on the "
                "--rdzv-endpoint host (c10d), and check that this node can reach that address"
            ) from None

    def close(self) -> None:
        """Leave the job; the host keeps its store up until every member left (close_timeout)."""
        if self.client is not None and self.round is not None:
            try:
                self.client.add(self._key(self.round.index, "left"), 1)
            except StoreGone:
                pass
        if self.server is not None and self.round is not None and self.client is not None:
            # The others read the end record from this store: keep it up until they left
            # (a lost node never will).
            index = self.round.index
            try:
                end = json.loads(self.client.get(self._key(index, "end")) or b"{}")
            except StoreGone:
                end = {}
            members = self.round.group_world_size - (end.get("reason") == "node_lost")
            self._wait_for_count(self._key(index, "left"), members)
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.server is not None:
            self.server.close()
            self.server = None

    def _wait_for_count(self, key: str, count: int) -> None:
        deadline = time.monotonic() + self.settings.close_timeout
        assert self.client is not None
        while time.monotonic() < deadline:
            try:
                if self.client.add(key, 0) >= count:
                    return
            except StoreGone:
                return
            time.sleep(0.05)  # the others' launchers read the end record and leave

    def _key(self, index: int, name: str) -> str:
        return f"{self.prefix}r{index}/{name}"

    def _wait(self, keys: list[str], timeout: float) -> bool:
        """Wait for ``keys`` on a connection of its own (a timed-out wait spoils a connection)."""
        if timeout <= 0:
            return False
        self._check_interrupted()
        client = self._connect()
        self._waiting = client
        try:
            self._check_interrupted()  # a signal between the check above and here
            return client.wait(keys, timeout)
        except StoreGone:
            self._check_interrupted()
            raise
        finally:
            self._waiting = None
            client.close()

    def _client(self) -> StoreClient:
        assert self.client is not None, "open() first"
        return self.client

    # -- rounds -----------------------------------------------------------------------------------

    def next_round(self) -> Round:
        """Join the next round and return it once closed, with the workers' store known.

        :raises RendezvousError: not enough nodes within ``join_timeout``, or the job ended.
        """
        client = self._client()
        index = (
            self.round.index + 1 if self.round is not None else int(client.get(self.prefix + "current") or 0)
        )
        me = NodeInfo(
            addr=self.addr,
            pid=os.getpid(),
            nproc=self.config.nproc_per_node,
            role=self.config.role,
            host=self.host,
            node_rank=self.config.node_rank if self.static else -1,
            store_host=self.server is not None,
        )
        while True:
            slot = client.add(self._key(index, "joined"), 1) - 1
            client.set(self._key(index, f"node/{slot}"), _dumps(asdict(me)))
            if slot == 0:
                self._close_round(index)
            elif not self._wait([self._key(index, "closed")], self._round_deadline()):
                raise RendezvousError(self._timeout_message(index))
            closed = json.loads(client.get(self._key(index, "closed")))
            if slot < closed["count"]:
                break
            # A closed round: get the running job to end it, then join the next one.
            if closed["count"] < self.config.max_nodes:
                self.end_round(index, {"reason": "joined", "host": me.host, "addr": me.addr})
            self.log.info("rendezvous round %s is closed; waiting for the next one", index)
            if not self._wait([self._key(index, "end")], self.settings.join_timeout):
                raise RendezvousError(self._timeout_message(index + 1))
            end = json.loads(client.get(self._key(index, "end")))
            if end.get("reason") not in ("joined", *FAILURE_REASONS):
                raise RendezvousError(f"the job ended ({end.get('reason')}) before this node could join it")
            index += 1

        nodes = self._members(index, closed["count"])
        group_rank = next(i for i, n in enumerate(nodes) if n == me)
        master_key = self._key(index, "master")
        if group_rank == 0:
            if self.static:
                assert self.server is not None
                self.server.clear(self.prefix)  # the last round's worker keys
                addr, port = self.config.master_addr, self.config.master_port
            else:
                addr, port = self.host_worker_store()
            client.set(master_key, _dumps([addr, port]))
        elif not self._wait([master_key], self.settings.close_timeout):
            raise RendezvousError(
                f"group rank 0 ({nodes[0].host}) did not publish the workers' store within "
                f"close_timeout={self.settings.close_timeout:g} s"
            )
        addr, port = json.loads(client.get(master_key))
        self.round = Round(index, group_rank, nodes, closed["restart_count"], addr, int(port))
        return self.round

    def _round_deadline(self) -> float:
        s = self.settings
        elastic = not self.static and self.config.min_nodes < self.config.max_nodes
        return s.join_timeout + (s.last_call_timeout if elastic else 0)

    def _timeout_message(self, index: int) -> str:
        joined = self._client().add(self._key(index, "joined"), 0)
        need = self.config.max_nodes if self.static else self.config.min_nodes
        return (
            f"rendezvous timed out: {joined} of {need} node(s) joined round {index} of "
            f"job {self.config.rdzv_id!r} within join_timeout={self.settings.join_timeout:g} s\n"
            "HINT: start the other nodes' launchers with the same --rdzv-id/--rdzv-endpoint and "
            "--nnodes, or raise --rdzv-conf join_timeout="
        )

    def _close_round(self, index: int) -> None:
        """The first node of a round closes it, like torchrun's last call."""
        cfg, s = self.config, self.settings
        node_key = lambda n: self._key(index, f"node/{n - 1}")  # noqa: E731
        # The static backend always waits for MAX nodes, as torchrun's does.
        need = cfg.max_nodes if self.static else cfg.min_nodes
        if not self._wait([node_key(need)], s.join_timeout):
            raise RendezvousError(self._timeout_message(index))
        if need < cfg.max_nodes:
            self._wait([node_key(cfg.max_nodes)], s.last_call_timeout)
        client = self._client()
        count = min(client.add(self._key(index, "joined"), 0), cfg.max_nodes)
        restart_count = 0
        if index > 0:
            before = json.loads(client.get(self._key(index - 1, "closed")) or b'{"restart_count": 0}')
            ended = json.loads(client.get(self._key(index - 1, "end")) or b"{}")
            restart_count = before["restart_count"] + (ended.get("reason") in FAILURE_REASONS)
        client.compare_set(
            self._key(index, "closed"), b"", _dumps({"count": count, "restart_count": restart_count})
        )
        client.set(self.prefix + "current", str(index).encode())

    def _members(self, index: int, count: int) -> tuple[NodeInfo, ...]:
        keys = [self._key(index, f"node/{i}") for i in range(count)]
        if not self._wait(keys, self.settings.close_timeout):
            raise RendezvousError(f"round {index}: a member did not publish its address in time")
        client = self._client()
        nodes = [NodeInfo(**json.loads(client.get(k))) for k in keys]
        if not self.static:
            return tuple(sorted(nodes, key=lambda n: (n.addr, n.pid)))
        ranks = sorted(n.node_rank for n in nodes)
        if ranks != list(range(count)):
            raise RendezvousError(
                f"the static rendezvous got node ranks {ranks}; each of --nnodes={count} launchers "
                f"needs its own --node-rank in 0..{count - 1}"
            )
        return tuple(sorted(nodes, key=lambda n: n.node_rank))

    # -- the end of a round ---------------------------------------------------------------------------

    def end_round(
        self, index: int, record: dict[str, Any], client: StoreClient | None = None
    ) -> dict[str, Any]:
        """Publish how round ``index`` ended, unless somebody already did; the record that won.
        ``client``: the calling thread's connection (default: the agent thread's)."""
        key = self._key(index, "end")
        won = (client or self._client()).compare_set(key, b"", _dumps(record))
        return dict(json.loads(won))

    def report_success(self, rnd: Round) -> None:
        """This node's workers all exited 0; the last node to say so ends the round."""
        if self._client().add(self._key(rnd.index, "succeeded"), 1) >= rnd.group_world_size:
            self.end_round(rnd.index, {"reason": "succeeded"})

    def watch(self, rnd: Round, post: Callable[[RoundEnded], None]) -> RoundWatch:
        return RoundWatch(self, rnd, post).start()


class RoundWatch:
    """Two threads for one round: one waits for ``r<N>/end`` and posts it; one beats this
    node's heartbeat and ends the round when another node's stops (its launcher died)."""

    def __init__(self, rdzv: JobRendezvous, rnd: Round, post: Callable[[RoundEnded], None]) -> None:
        self.rdzv = rdzv
        self.round = rnd
        self.post = post
        self._stop = threading.Event()
        self._end_client = rdzv._connect()
        self._hb_client = rdzv._connect()

    def start(self) -> RoundWatch:
        for target, name in ((self._wait_end, "end"), (self._beat, "heartbeat")):
            threading.Thread(target=target, name=f"monarch-launch-rdzv-{name}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._end_client.close()

    def _lost_store(self, err: Exception) -> None:
        if self._stop.is_set():
            return
        record: dict[str, Any] = {
            "reason": "store_lost",
            "detail": f"{err} (did the launcher hosting it die?)",
        }
        for group_rank, node in enumerate(self.round.nodes):
            if node.store_host:
                record.update(node=group_rank, host=node.host, pid=node.pid)
        self.post(RoundEnded(self.round.index, record))

    def _wait_end(self) -> None:
        key = self.rdzv._key(self.round.index, "end")
        try:
            self._end_client.wait([key], None)
            record = json.loads(self._end_client.get(key))
        except StoreGone as err:
            self._lost_store(err)
            return
        if not self._stop.is_set():
            self.post(RoundEnded(self.round.index, record))

    def _beat(self) -> None:
        rnd, s = self.round, self.rdzv.settings
        key = lambda gr: self.rdzv._key(rnd.index, f"hb/{gr}")  # noqa: E731
        others = [gr for gr in range(rnd.group_world_size) if gr != rnd.group_rank]
        seen: dict[int, tuple[int, float]] = {gr: (-1, time.monotonic()) for gr in others}
        limit = s.keep_alive_interval * s.keep_alive_max_attempt
        try:
            while not self._stop.is_set():
                self._hb_client.add(key(rnd.group_rank), 1)
                # One read-only round trip for every other node's counter (missing: 0).
                counts = self._hb_client.multi_get([key(gr) for gr in others])
                now = time.monotonic()
                for gr, value in zip(others, counts):
                    count = int(value or 0)
                    last_count, since = seen[gr]
                    if count != last_count:
                        seen[gr] = (count, now)
                    elif now - since > limit:
                        node = rnd.nodes[gr]
                        self.rdzv.end_round(
                            rnd.index,
                            {
                                "reason": "node_lost",
                                "node": gr,
                                "host": node.host,
                                "pid": node.pid,
                                "seconds": round(now - since, 1),
                            },
                            self._hb_client,
                        )
                        return
                self._stop.wait(s.keep_alive_interval)
        except StoreGone as err:
            self._lost_store(err)
        finally:
            self._hb_client.close()
