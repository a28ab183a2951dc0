"""A client's session on a host agent: the process that spawns that client's procs there.

A host agent (``host/agent.py``) serves clients that proved they hold its secret. For each
client it starts one session process: an ordinary worker of the *client's* job (the client's
job secret, read from a pipe; a socket directory of its own on this host), so the client and
every process of its job talk to it, and to the procs it spawns, like to any other process.
This module is what runs in it:

* at start (``on_worker_start``, named in the bootstrap's init modules), it registers the
  ``HostActor`` under a well-known key and sends its address to the client's port, which is
  how the client learns where the session listens;
* ``HostActor.start_group`` starts procs with the same ``ProcGroup`` as on the client's own host
  (``preload``, ``env``, ``bootstrap`` gating), reads their output and sends it to the
  requester (``log_capture``), and reports each exit to the requester's port. It may start
  them on spare sockets bound ahead of time, whose addresses the client was given (in the
  announcement, then with each reply that used some): such a client knows the new procs'
  addresses without waiting for the reply, so ``spawn_procs`` in a coroutine never blocks;
* when a requester is lost (its process died, or its heartbeats stopped: ``host/heartbeat``),
  the procs it spawned here are killed; when the agent ends the session (the client went away),
  this process is killed and its procs notice their parent's death (``runtime/parent_death``)
  and exit. A client whose heartbeats stopped has declared this host lost: the session exits.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from monarch._src.actor import dispatch
from monarch._src.actor.actor import Actor
from monarch._src.actor.actor_mesh import ActorMesh
from monarch._src.actor.endpoint import endpoint
from monarch._src.actor.port import Port
from monarch._src.actor.process_state import runtime
from monarch._src.host.heartbeat import HEARTBEAT_KEY, HeartbeatActor
from monarch._src.mesh.shape import Shape
from monarch._src.runtime.config import OVERRIDES_ENV, with_this_machine
from monarch._src.wire import payload, protocol

logger = logging.getLogger("monarch.host")

#: In a proc spawned by a session: the session's address (that proc's ``this_host()``).
SESSION_ENV = "MONARCH_HOST_SESSION"
#: The actor key of every session's ``HostActor``.
HOST_ACTOR_KEY = "__monarch_host__"
#: The bootstrap setting naming the client's port the session announces itself to.
ANNOUNCE = "announce"
#: Listening sockets bound ahead for the client's procs (``spare``): one host's procs of a
#: ``spawn_procs`` in a coroutine, if no more than this many, start without a round trip.
SPARE_SOCKETS = 8

#: address -> a listening socket bound ahead, that ``start_group`` may be told to use.
_spare: dict[str, socket.socket] = {}


def bind_spares(count: int) -> list[str]:
    """Bind ``count`` more spare sockets; returns their addresses."""
    from monarch._src.transport.address import of_listening_socket

    rt = runtime()
    addresses = []
    for _ in range(count):
        sock = rt.new_listen_socket()
        address = of_listening_socket(sock)
        _spare[address] = sock
        addresses.append(address)
    return addresses


class HostActor(Actor):
    """Spawns, stops and kills procs on this host for any process of the job."""

    def __init__(self) -> None:
        from monarch._src.host.spawner import ProcGroup

        self._group_class = ProcGroup
        self._groups: dict[int, Any] = {}
        #: requester address -> ids of the groups it spawned here.
        self._by_requester: dict[str, set[int]] = {}
        self._next_id = 0
        runtime().on_peer_lost(self._requester_lost)

    @endpoint
    def start_group(
        self,
        name: str,
        envs: Sequence[Mapping[str, str]],
        gated: bool,
        preload: Sequence[str],
        exits: Port[tuple[int, str, int]],
        requester: str,
        spares: Sequence[str] = (),
    ) -> tuple[int, list[str], list[int], list[str]]:
        """Start one proc per entry of ``envs``, on the ``spares`` sockets (by address) if
        given; their output goes to ``requester`` and each exit ``(rank, how, code)`` to
        ``exits``. Returns (group id, addresses, pids, addresses of new spares that replace the
        ones used)."""
        missing = [a for a in spares if a not in _spare]
        if missing or (spares and len(spares) != len(envs)):
            raise ValueError(f"not spare sockets of the session at {runtime().address}: {missing}")
        sockets = [_spare.pop(a) for a in spares]
        address = runtime().address
        procs_envs: list[dict[str, str]] = [{**env, SESSION_ENV: address} for env in envs]
        for env in procs_envs:  # the client's settings, this machine's ways to listen
            if OVERRIDES_ENV in env:
                env[OVERRIDES_ENV] = with_this_machine(env[OVERRIDES_ENV])
        group = self._group_class(
            name, procs_envs, gated=gated, preload=list(preload), output_to=requester, listen_sockets=sockets
        )
        group_id = self._next_id
        self._next_id += 1
        self._groups[group_id] = group
        self._by_requester.setdefault(requester, set()).add(group_id)

        def exited(rank: int, how: str, code: int) -> None:
            try:
                exits.send((rank, how, code))
            except Exception:
                logger.debug("could not report an exit to %s", requester, exc_info=True)
            if not any(group.alive()):
                self._groups.pop(group_id, None)
                self._by_requester.get(requester, set()).discard(group_id)

        group.watch_exits(exited)
        return group_id, list(group.addresses), [proc.pid for proc in group.procs], bind_spares(len(spares))

    @endpoint
    def stop_group(self, group_id: int, reason: str) -> None:
        """Ask the group's procs to exit (killed after the stop timeout); exits are reported."""
        group = self._groups.get(group_id)
        if group is not None:
            group.stop(reason)

    @endpoint
    def kill_group(self, group_id: int) -> None:
        group = self._groups.get(group_id)
        if group is not None:
            group.kill()

    @endpoint
    def requester_silent(self, address: str, why: str) -> None:
        """Its heartbeats stopped (``HeartbeatActor``): it has declared this host lost by now."""
        self._requester_lost(address, TimeoutError(why))

    def _requester_lost(self, address: str, reason: BaseException) -> None:
        for group_id in self._by_requester.pop(address, set()):
            group = self._groups.get(group_id)
            if group is not None:
                logger.warning("killing %s: the process that spawned it is gone (%s)", group.name, reason)
                group.kill()


def host_actor(session: str) -> ActorMesh[HostActor]:
    """The ``HostActor`` of the session at ``session``."""
    return ActorMesh(HostActor, "host", HOST_ACTOR_KEY, (session,), Shape.unity())


def _announce(reply: list) -> None:
    """(main thread, runtime live) Start the HostActor and the HeartbeatActor, then tell the
    client where we are."""
    rt = runtime()
    host = host_actor(rt.address)
    actors: list[tuple[str, str, tuple[type, tuple, dict]]] = [
        (HOST_ACTOR_KEY, "host", (HostActor, (), {})),
        (HEARTBEAT_KEY, "heartbeat", (HeartbeatActor, (host,), {})),
    ]
    for key, name, init in actors:
        dispatch.handle_spawn(
            protocol.spawn(key, name, 0, [[], []], (rt.address,), [name, name, "<host agent>"], None),
            payload.dumps(init),
        )
    info = {
        "address": rt.address,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "spare": bind_spares(SPARE_SOCKETS),
    }
    announce: Port[dict[str, Any]] = Port(reply[0], reply[1])
    announce.send(info)


def on_worker_start(config: dict[str, Any]) -> None:
    """Bootstrap hook: announce this session once its runtime is up (before it, nothing can
    be sent)."""
    from monarch._src.runtime import bootstrap

    reply = config[ANNOUNCE]
    bootstrap.run_on_main_thread(lambda: _announce(reply))
