"""The client's side of host agents: attaching to them, and the procs they spawn for it.

``attach`` opens one connection per agent, authenticated with the agent's secret, and sends
the hello that makes the agent start this job's session on its host (``host/session.py``);
the session answers on a port with its address. All of it happens on the runtime's loop: the
``HostMesh`` exists at once, and ``Host.session`` resolves when the host is ready or fails
(naming the agent's address) when it cannot be reached, refuses the secret, or does not start
a session within ``host_attach_timeout_s``.

``RemoteProcGroup`` is what owns procs spawned on such hosts (the ``ProcOwner`` of their
``ProcMesh``): each session's ``HostActor`` starts them and reports their exits to a port of
the spawning process, which turns them into the same supervision events as a local exit.
Called from a coroutine, it does not wait for the sessions' answers (that would block the
caller's event loop): the procs start on sockets each session bound ahead (``Host.spare``), and
a host that fails to start them reports them failed. If a
host is lost (its session's connection drops for good, the agent connection closes, or it
answers no heartbeat for ``host_heartbeat_timeout_s``: ``host/heartbeat``), every proc there is
reported failed at once, so pending calls fail and owners hear of it.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from monarch._src.actor import multicast, supervision
from monarch._src.actor.actor_mesh import ActorMesh
from monarch._src.actor.future import (
    Future,
    add_done_callback,
    completed_future,
    outcome,
    pending_future,
    set_exception,
    set_result,
    when_all_done,
)
from monarch._src.actor.port import Port, PortHandler, handler_of
from monarch._src.actor.proc_mesh import root_address
from monarch._src.actor.process_state import runtime
from monarch._src.host import log_capture
from monarch._src.host.heartbeat import HEARTBEAT_KEY, HeartbeatActor, Pulse
from monarch._src.host.session import host_actor
from monarch._src.mesh.shape import Shape
from monarch._src.runtime import output_writer
from monarch._src.runtime.config import CONFIG, OVERRIDES_ENV, overrides_for_another_host
from monarch._src.transport import auth
from monarch._src.wire import protocol
from monarch._src.wire.frame import encode_frame

logger = logging.getLogger("monarch.host")

ATTACH_FAILED = "attach failed: config push failed during attach"
ATTACH_HINT = (
    "HINT: check that the agent runs (python -m monarch.host --listen ADDRESS ...) and that "
    "this client has its secret (MONARCH_HOST_SECRET or MONARCH_HOST_SECRET_FILE); "
    "host_attach_timeout_s (MONARCH_HOST_ATTACH_TIMEOUT_S) sets how long attaching may take."
)
#: At most this long an exit report waits for the proc's last output to be written here.
EXIT_AFTER_OUTPUT_S = 1.0
#: Seconds past the stop timeout that a stopping group waits for its hosts' exit reports.
STOP_REPORT_GRACE_S = 5.0


class Host:
    """One machine of a ``HostMesh``, reached through a host agent.

    ``session`` resolves to the address of this job's session there. Pickles as a reference
    to that session, so an actor given the host mesh spawns procs on that machine too. While
    the host is still attaching, pickling waits for it, except in a coroutine: blocking its
    loop would hold up everything else on it (and on the runtime's loop, the attachment
    itself), so it raises there, saying what to await first.
    """

    __slots__ = ("agent", "session", "spare")

    def __init__(self, agent: str, session: Future[str]) -> None:
        self.agent = agent
        self.session = session
        #: Addresses of listening sockets the session bound ahead for this client's procs (a
        #: reference to the host, in another process, has none); taken under ``_lock``.
        self.spare: list[str] = []

    @property
    def attached(self) -> bool:
        """This job's session there started (and its address is known)."""
        return self.session.done() and outcome(self.session)[1] is None

    def session_address(self) -> str:
        return self.session.get(timeout=CONFIG.host_attach_timeout_s + 1.0)

    def __reduce__(self) -> Any:
        if not self.session.done() and _in_coroutine():
            raise RuntimeError(
                f"a HostMesh cannot be sent to another process while its host {self.agent} is "
                "still attaching, and waiting for it here would block this coroutine's event loop\n"
                "HINT: `await host_mesh.initialized` (or enter `async with host_mesh:`) first."
            )
        return (host_reference, (self.agent, self.session_address()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Host) and other.agent == self.agent

    def __hash__(self) -> int:
        return hash(self.agent)

    def __repr__(self) -> str:
        return f"Host({self.agent})"


def host_reference(agent: str, session: str) -> Host:
    return Host(agent, completed_future(session))


class _Announcement(PortHandler):
    """Receives the session's ``{"address", "hostname", "pid"}`` once it is up."""

    label = "host attach"

    def __init__(self, connection: HostConnection) -> None:
        self._connection = connection
        self.open()

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        self.close()
        self._connection.announced(value)


class HostConnection:
    """This client's connection to one host agent; its closing means the host is lost."""

    def __init__(self, agent: str, secret: bytes) -> None:
        self.agent = agent
        self._secret = secret
        self.host = Host(agent, pending_future())
        self._conn: Any = None
        self._timer: Any = None
        self._announcement: _Announcement | None = None
        self.closing = False

    def start(self) -> None:
        """Connect and ask for a session, in the background."""
        from monarch._src.transport import tls
        from monarch._src.transport.outgoing import OutgoingConnection

        rt = runtime()
        watch_hosts()
        self._announcement = announcement = _Announcement(self)
        nonce, sealed = auth.seal(self._secret, rt.secret)
        hello = protocol.host_hello([rt.address, announcement.port_id], root_address(), nonce)
        frame = encode_frame(hello, [sealed], rt.max_frame_bytes)
        timeout = CONFIG.host_attach_timeout_s

        def begin() -> None:  # on the loop
            try:
                unreachable_client(rt.address, self.agent)
                contexts = tls.contexts(CONFIG.tls_cert, CONFIG.tls_key, CONFIG.tls_ca)
            except ValueError as e:
                self._failed(e)
                return
            conn = OutgoingConnection(
                rt.loop,
                self.agent,
                self._secret,
                on_close=self._closed,
                name=f"host agent {self.agent}",
                loop_ident=rt.loop_thread.ident,
                unreachable_timeout_s=timeout,
                tls=contexts.client if contexts else None,
            )
            self._conn = conn
            conn.send(frame)
            rt.loop.create_task(conn.connect())
            self._timer = rt.loop.call_later(timeout, self._attach_timed_out)

        rt.loop_thread.call_soon(begin)

    def announced(self, info: dict[str, Any]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with _lock:
            self.host.spare.extend(info.get("spare", ()))
        set_result(self.host.session, info["address"])
        keep_alive(self.agent, info["address"], self._heartbeat_lost)

    def _heartbeat_lost(self, why: str) -> None:
        """The host stopped answering: lost now. Closing the agent connection makes the agent
        end the session (and its procs) if the host ever reads it again (a frozen one resumed)."""
        host_lost(self.host.session_address(), why)
        if self._conn is not None:
            self._conn.close()

    def _failed(self, why: BaseException | str) -> None:
        if self._announcement is not None:
            self._announcement.close()
        set_exception(
            self.host.session,
            RuntimeError(f"{ATTACH_FAILED}: host agent at {self.agent}: {why}\n{ATTACH_HINT}"),
        )
        if self._conn is not None and not self._conn.closed:
            self._conn.close()

    def _attach_timed_out(self) -> None:
        if self._conn is not None and not self._conn.authenticated:
            return  # the connection's own bound (the same) closes it, saying what it last met
        if not self.host.session.done():
            self._failed(f"no session started within {CONFIG.host_attach_timeout_s}s")

    def _closed(self, conn: Any, reason: BaseException) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.host.session.done():
            self._failed(reason)
            return
        if outcome(self.host.session)[1] is not None:
            return  # it never attached: nothing was spawned there
        session = self.host.session_address()
        host_lost(session, f"the connection to host agent {self.agent} closed ({reason})", self.closing)

    def close(self) -> None:
        """Let the agent end this job's session (and kill what is left of its procs)."""
        self.closing = True
        if self.host.attached:
            stop_heartbeat(self.host.session_address())
        rt = runtime()
        if self._conn is not None and not rt.closed:
            rt.loop_thread.call_soon(self._conn.close)


def unreachable_client(client: str, agent: str) -> None:
    """ValueError where a session on ``agent``'s host could not reach this client back at
    ``client`` (its announcement, replies and procs' output all come that way)."""
    from monarch._src.transport.address import is_loopback

    if is_loopback(agent) or not is_loopback(client):  # ValueError for a malformed address
        return
    raise ValueError(
        f"this client listens at {client}, which the host at {agent} cannot connect back to\n"
        "HINT: call monarch.actor.enable_transport('tcp') first thing, with tcp_bind_host "
        "(MONARCH_TCP_BIND_HOST) set to an address of this machine that the hosts can reach."
    )


def attach(agents: Sequence[str], secret: bytes) -> list[HostConnection]:
    connections = [HostConnection(agent, secret) for agent in agents]
    for c in connections:
        c.start()
    return connections


# -- procs spawned on remote hosts --------------------------------------------------------------


class _ExitReports(PortHandler):
    """Exits ``(rank on that host, how, code)`` reported by one host's session. While open,
    it keeps its group alive, as a local group is kept by its exit watchers."""

    label = "proc exits"

    def __init__(self, group: RemoteProcGroup, first_rank: int) -> None:
        self._group = group
        self._first = first_rank
        self.open()

    def deliver(self, rank: int | None, value: Any, is_exception: bool) -> None:
        if not is_exception:
            local_rank, how, code = value
            # What the proc printed before it died came first on the session's connection and
            # is queued to this process's output writers: report the exit once it is written.
            output_writer.after_written(
                lambda: self._group.exited(self._first + local_rank, how, code),
                runtime().loop,
                EXIT_AFTER_OUTPUT_S,
            )


_lock = threading.Lock()
#: session address -> the groups with procs there (to report them when the host is lost).
_by_session: dict[str, weakref.WeakSet[RemoteProcGroup]] = {}
_live: weakref.WeakSet[RemoteProcGroup] = weakref.WeakSet()
#: session address -> why that host was lost (nothing can be spawned there any more).
_lost: dict[str, str] = {}
#: Sessions this process spawned procs on: their loss is news here even with no procs left.
_sessions_seen: set[str] = set()


class RemoteProcGroup:
    """The procs of one ``spawn_procs`` on hosts reached through agents (see the module doc)."""

    def __init__(
        self,
        name: str,
        hosts: Sequence[Host],
        envs_by_host: Sequence[Sequence[Mapping[str, str]]],
        gated: bool,
        preload: Sequence[str],
    ) -> None:
        rt = runtime()
        watch_hosts()
        self.name = name
        self.addresses: list[str] = []
        self._pids: list[int] = []
        self.returncodes: list[int | None] = []
        self._exit_futures: list[Future[int]] = []
        self._on_exit: list[Callable[[int, int], None]] = []
        self._stop_requested = False
        #: (session address, group id there, first rank, number of procs)
        self._parts: list[tuple[str, Future[int], int, int]] = []
        self._handlers: list[_ExitReports] = []
        #: In a coroutine, the spare sockets taken on each host (None: ask and wait).
        spares = _take_spares(hosts, [len(envs) for envs in envs_by_host]) if _in_coroutine() else None
        sessions = [host.session_address() for host in hosts]  # raises if a host is unreachable
        _sessions_seen.update(sessions)
        for host, session in zip(hosts, sessions):
            if session in _lost:
                raise RuntimeError(f"cannot spawn procs on the host of agent {host.agent}: {_lost[session]}")
            keep_alive(host.agent, session)
        overrides = overrides_for_another_host()
        if overrides is not None:  # what configure() set here, for procs there (given env wins)
            envs_by_host = [[{OVERRIDES_ENV: overrides, **env} for env in envs] for envs in envs_by_host]
        calls = []
        first = 0
        for i, (session, envs) in enumerate(zip(sessions, envs_by_host)):
            handler = _ExitReports(self, first)
            self._handlers.append(handler)
            exits: Port[Any] = Port(rt.address, handler.port_id)
            calls.append(
                host_actor(session).start_group.call_one(
                    name, list(envs), gated, list(preload), exits, rt.address, spares[i] if spares else []
                )
            )
            first += len(envs)
        #: The sessions' answers still to come (``spares``): they bring the pids.
        self._starting = calls if spares is not None else []
        if spares is not None:
            for session, addresses in zip(sessions, spares):
                group_id: Future[int] = pending_future()
                self._parts.append((session, group_id, len(self.addresses), len(addresses)))
                self.addresses += addresses
            self._pids = [0] * len(self.addresses)
        else:
            self._wait_for_sessions(hosts, sessions, calls)
        for session, _, first, count in self._parts:
            multicast.add_host(session, self.addresses[first : first + count])
        self.returncodes = [None] * len(self.addresses)
        self._exit_futures = [pending_future() for _ in self.addresses]
        with _lock:
            supervision.locally_spawned.update(self.addresses)  # exits come with their status
            for session in sessions:
                _by_session.setdefault(session, weakref.WeakSet()).add(self)
            _live.add(self)
        weakref.finalize(self, _forget, tuple(self.addresses), [h.port_id for h in self._handlers])
        log_capture.maybe_register_ipython_hook()
        if spares is not None:
            for host, call, part in zip(hosts, calls, self._parts):
                add_done_callback(call, functools.partial(self._started, host, part))

    def _wait_for_sessions(
        self, hosts: Sequence[Host], sessions: list[str], calls: list[Future[Any]]
    ) -> None:
        """Wait for each session's answer to ``start_group``: the procs' addresses and pids."""
        first = 0
        failure: tuple[Host, BaseException] | None = None
        for host, session, call in zip(hosts, sessions, calls):
            try:
                group_id, addresses, pids, _ = call.get(timeout=CONFIG.peer_unreachable_s)
            except Exception as e:  # the others are still waited for: what started must be killed
                failure = failure or (host, e)
                continue
            self._parts.append((session, completed_future(group_id), first, len(addresses)))
            self.addresses += addresses
            self._pids += pids
            first += len(addresses)
        if failure is not None:
            self.kill()
            for handler in self._handlers:
                handler.close()
            host, error = failure
            raise RuntimeError(
                f"spawning {self.name} on the host of agent {host.agent} failed: {error}"
            ) from error

    def _started(self, host: Host, part: tuple[str, Future[int], int, int], call: Future[Any]) -> None:
        """A session answered ``start_group`` for procs started on its spare sockets."""
        _, group_id, first, count = part
        value, error = outcome(call)
        if error is not None:
            set_exception(group_id, error)
            for rank in range(first, first + count):
                self.exited(rank, f"could not be started on the host of agent {host.agent}: {error}", -1)
            return
        number, _, pids, spare = value  # type: ignore[misc]
        self._pids[first : first + count] = pids
        with _lock:
            host.spare.extend(spare)
        set_result(group_id, number)

    @property
    def pids(self) -> list[int]:
        """The procs' pids, by rank (for procs spawned from a coroutine, once the hosts said)."""
        for call in self._starting:
            try:
                call.get(timeout=CONFIG.peer_unreachable_s)
            except Exception:
                pass  # those procs are reported failed (``_started``); their pids stay 0
        return self._pids

    # -- ProcOwner ---------------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self._stop_requested

    def watch_exits(self, on_exit: Callable[[int, int], None]) -> None:
        self._on_exit.append(on_exit)
        for rank, code in enumerate(list(self.returncodes)):
            if code is not None:
                on_exit(rank, code)

    def stop(self, reason: str = "stopped") -> Future[None]:
        """Ask every proc to exit (each session kills those that do not within its stop
        timeout); resolves once every exit was reported, or the hosts stopped answering."""
        self._stop_requested = True
        self._tell_each_session(
            "stop", lambda session, group_id: host_actor(session).stop_group.broadcast(group_id, reason)
        )

        def overdue() -> None:
            for rank, code in enumerate(self.returncodes):
                if code is None:
                    self.exited(rank, "did not report its exit (its host stopped answering)", -9)

        return when_all_done(list(self._exit_futures), CONFIG.stop_timeout_s + STOP_REPORT_GRACE_S, overdue)

    def kill(self) -> None:
        self._stop_requested = True
        self._tell_each_session(
            "kill", lambda session, group_id: host_actor(session).kill_group.broadcast(group_id)
        )

    def _tell_each_session(self, what: str, send: Callable[[str, int], None]) -> None:
        """``send(session, group id)`` for each host, once the group there has an id."""
        for session, group_id, _, _ in self._parts:

            def tell(started: Future[int], session: str = session) -> None:
                number, error = outcome(started)  # type: ignore[arg-type]
                if number is None or error is not None:
                    return  # nothing started there
                try:
                    send(session, number)
                except Exception:
                    logger.debug("could not ask %s to %s %s", session, what, self.name, exc_info=True)

            add_done_callback(group_id, tell)

    # -- exits ---------------------------------------------------------------------------------------

    def exited(self, rank: int, how: str, code: int) -> None:
        """Proc ``rank`` is gone: the same report as a local exit (``spawner``)."""
        with _lock:
            if self.returncodes[rank] is not None:
                return
            self.returncodes[rank] = code
        supervision.process_exited(
            self.addresses[rank], f"process {rank} of {self.name} {how}", expected=self._stop_requested
        )
        for cb in list(self._on_exit):
            try:
                cb(rank, code)
            except Exception:
                logger.exception("exit callback failed")
        set_result(self._exit_futures[rank], code)
        if all(c is not None for c in self.returncodes):
            for handler in self._handlers:  # no more reports: the group may be collected
                handler.close()

    def host_lost(self, session: str, why: str) -> None:
        for part_session, _, first, count in self._parts:
            if part_session == session:
                for rank in range(first, first + count):
                    self.exited(rank, f"was lost with its host: {why}", -9)

    def live_addresses(self) -> list[str]:
        if self._stop_requested:
            return []
        return [a for a, code in zip(self.addresses, self.returncodes) if code is None]


def _in_coroutine() -> bool:
    """Whether this thread runs an asyncio event loop (a coroutine called): waiting blocks it."""
    asyncio = sys.modules.get("asyncio")  # none imported: no loop can be running
    return asyncio is not None and asyncio._get_running_loop() is not None


def _take_spares(hosts: Sequence[Host], counts: list[int]) -> list[list[str]] | None:
    """``counts[i]`` spare sockets of each attached host, or None (and none taken) if some host
    is still attaching or has too few."""
    with _lock:
        if not all(host.attached and len(host.spare) >= n for host, n in zip(hosts, counts)):
            return None
        taken = []
        for host, n in zip(hosts, counts):
            taken.append(host.spare[:n])
            del host.spare[:n]
        return taken


def _forget(addresses: tuple[str, ...], port_ids: list[int]) -> None:
    for port_id in port_ids:
        handler = handler_of(port_id)
        if handler is not None:
            handler.close()
    supervision.forget_processes(addresses)
    multicast.forget(addresses)


def host_lost(session: str, why: str, expected: bool = False) -> None:
    """Every proc on the host whose session is ``session`` is gone."""
    stop_heartbeat(session)
    with _lock:
        if not expected:
            _lost.setdefault(session, f"the host was lost: {why}")  # the first cause is the news
        groups = list(_by_session.pop(session, ()))
    for group in groups:
        if expected:
            group._stop_requested = True
        group.host_lost(session, why)


def _peer_lost(address: str, reason: BaseException) -> None:
    if address in _by_session or address in _sessions_seen:
        agent = _agent_of.get(address, "?")
        host_lost(address, f"its session at {address} (host agent {agent}) is gone ({reason})")


#: session address -> this process's heartbeat to it.
_pulses: dict[str, Pulse] = {}
#: session address -> the address of its host's agent (to name the host in reports).
_agent_of: dict[str, str] = {}


def keep_alive(agent: str, session: str, on_lost: Callable[[str], None] | None = None) -> None:
    """Heartbeat ``session`` (once per process; not with ``host_heartbeat_timeout_s`` 0): if it
    stops answering, ``on_lost(why)``, by default ``host_lost``."""
    _agent_of[session] = agent
    if not CONFIG.host_heartbeat_timeout_s:
        return
    with _lock:
        if session in _pulses or session in _lost:
            return
        rt = runtime()
        heartbeat = ActorMesh(HeartbeatActor, "heartbeat", HEARTBEAT_KEY, (session,), Shape.unity()).beat

        def ping(port: Port[None], timeout_s: float) -> None:
            heartbeat.send_to_port((rt.address, timeout_s), {}, port, "all")

        pulse = _pulses[session] = Pulse(agent, ping, on_lost or (lambda why: host_lost(session, why)))
    pulse.start()


def stop_heartbeat(session: str) -> None:
    with _lock:
        pulse = _pulses.pop(session, None)
    if pulse is not None:
        pulse.stop()


_watching = False


def watch_hosts() -> None:
    """Hear of lost sessions (once per process)."""
    global _watching
    with _lock:
        if _watching:
            return
        _watching = True
    runtime().on_peer_lost(_peer_lost)


def _live_remote_workers() -> list[str]:
    with _lock:
        groups = list(_live)
    return [a for g in groups for a in g.live_addresses()]


log_capture.worker_address_sources.append(_live_remote_workers)


def groups_on(sessions: Sequence[str]) -> list[RemoteProcGroup]:
    """The live groups with procs on any of these sessions' hosts."""
    with _lock:
        return list({g for s in sessions for g in _by_session.get(s, ())})
