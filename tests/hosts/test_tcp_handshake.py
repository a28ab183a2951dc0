"""Strangers over TCP: the same mutual HMAC handshake and pre-authentication limits as on Unix
sockets. Nothing a peer sends is decoded before it proves the job secret, and a flood of
strangers (idle, or sending junk) costs the proc bounded memory and descriptors."""

from __future__ import annotations

import os
import socket
from typing import Any

import psutil
import pytest
from helpers import wait_until
from tcp_helpers import (
    CHALLENGE_BYTES,
    Where,
    frame_head,
    handshake,
    recv_exactly,
    tcp_connect,
    tcp_procs,
    worker_log,
)

from monarch._src.actor.process_state import runtime
from monarch._src.transport.listener import MAX_PENDING_HANDSHAKES
from monarch.actor import Actor, endpoint

#: A frame of a kind nobody handles: a proc that decodes it logs that it dropped it.
UNKNOWN_KIND = 9999
IDLE_STRANGERS = 2000
JUNK_STRANGERS = 200
JUNK_BYTES = 256 << 10
RSS_GROWTH_BOUND = 64 << 20


@pytest.fixture
def tcp_where():
    """(actor, pid, tcp address) of a proc listening on loopback TCP."""
    with tcp_procs() as pm:
        where = pm.spawn("where", Where)
        pid, address = where.where.call_one().get(timeout=30)
        assert address.startswith("tcp:127.0.0.1:")
        yield where, pid, address


@pytest.mark.timeout(60)
def test_wrong_secret_over_tcp_is_refused_and_nothing_is_decoded(tcp_where):
    where, pid, address = tcp_where
    frame = frame_head({"k": UNKNOWN_KIND, "b": []})
    dropped = f"dropping frame of unknown kind {UNKNOWN_KIND}"
    # With the job's secret, that frame is decoded (and dropped with a log line)...
    with tcp_connect(address) as s:
        assert len(handshake(s, runtime().secret)) == 32
        s.sendall(frame)
        wait_until(lambda: dropped in worker_log(pid), what="the authenticated frame to be decoded")
    # ...with another secret, the connection is closed and the frame never decoded.
    with tcp_connect(address) as s:
        s.sendall(frame)  # sent before the proof: waits in the socket
        assert handshake(s, os.urandom(32)) == b""
    wait_until(lambda: "wrong job secret" in worker_log(pid), what="the refusal to be logged")
    assert worker_log(pid).count(dropped) == 1
    assert where.echo.call_one("still serving").get(timeout=10) == "still serving"


@pytest.mark.timeout(60)
def test_junk_instead_of_a_proof_closes_the_connection(tcp_where):
    where, pid, address = tcp_where
    with tcp_connect(address) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: monarch\r\n\r\n" + os.urandom(200))
        # At most the server's challenge, never a proof that it accepted us; then it hangs up
        # (with a reset, as the junk it did not read is thrown away).
        received = recv_exactly(s, 1 << 20)
        assert len(received) <= CHALLENGE_BYTES
    assert where.echo.call_one([1, 2]).get(timeout=10) == [1, 2]


@pytest.mark.timeout(120)
def test_flood_of_strangers_over_tcp_costs_bounded_memory(tcp_where):
    where, pid, address = tcp_where
    worker = psutil.Process(pid)
    before = worker.memory_info().rss
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE_STRANGERS):
            idle.append(tcp_connect(address))
        for _ in range(JUNK_STRANGERS):  # far more than a proof, before the challenge is read
            with tcp_connect(address) as s:
                try:
                    s.sendall(os.urandom(JUNK_BYTES))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before it finished sending: as it should be
        # Accepted in order: once a real peer got through the handshake, so did the flood.
        with tcp_connect(address) as s:
            assert len(handshake(s, runtime().secret)) == 32
        growth = worker.memory_info().rss - before
        fds = worker.num_fds()
        assert growth < RSS_GROWTH_BOUND, f"grew by {growth >> 20} MiB for the flood"
        assert fds < MAX_PENDING_HANDSHAKES + 64, (
            f"{fds} descriptors open for {IDLE_STRANGERS} idle strangers"
        )
        assert where.echo.call_one("still serving").get(timeout=10) == "still serving"
    finally:
        for s in idle:
            s.close()


class Caller(Actor):
    """Makes a blocking call from its own thread: that thread gets a reply address of its own
    (a second listener of its process)."""

    @endpoint
    def call(self, other: Any) -> Any:
        return other.echo.call_one("via a reply address").get(timeout=30)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _listening_ports(pid: int) -> list[int]:
    return sorted(
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    )


@pytest.mark.timeout(120)
def test_the_handshake_cap_is_shared_by_all_listeners_of_a_process() -> None:
    # Over TCP a proc's reply addresses listen too; a stranger who found them all must not get
    # the cap of idle connections once per listener.
    with tcp_procs(2) as pm:
        where = pm.spawn("where", Where).slice(gpus=1)  # another proc: its replies come by TCP
        caller = pm.spawn("caller", Caller).slice(gpus=0)
        assert caller.call.call_one(where).get(timeout=30) == "via a reply address"
        pid = caller.pid.call_one().get(timeout=30)
        ports = _listening_ports(pid)
        assert len(ports) >= 2, ports  # the process address and the caller thread's
        worker = psutil.Process(pid)
        before = worker.num_fds()
        idle: list[socket.socket] = []
        try:
            for port in ports:
                idle += [tcp_connect(f"tcp:127.0.0.1:{port}") for _ in range(MAX_PENDING_HANDSHAKES + 44)]
                # Accepted in order: once a real peer got through, so did this listener's flood
                # (a real peer waiting while the next listener's flood comes in is dropped as
                # the oldest: the cap is shared).
                with tcp_connect(f"tcp:127.0.0.1:{port}") as s:
                    assert len(handshake(s, runtime().secret)) == 32
            grown = worker.num_fds() - before
            assert grown <= MAX_PENDING_HANDSHAKES + 8, (
                f"{grown} more descriptors for {len(idle)} idle strangers on {len(ports)} listeners"
            )
            assert caller.call.call_one(where).get(timeout=30) == "via a reply address"
        finally:
            for s in idle:
                s.close()
