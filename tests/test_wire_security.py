"""Authenticated transport: strangers are disconnected, the runtime keeps working; frame limits."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch.actor import Actor, endpoint

REPO = Path(__file__).resolve().parents[1]
MAGIC = b"MNRC"
CHALLENGE_BYTES = 4 + 1 + 32


class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def address(self) -> str:
        from monarch._src.actor.process_state import runtime

        return runtime().address


def client_socket_path() -> str:
    from monarch._src.actor.process_state import runtime

    address = runtime().address
    assert address.startswith("unix:")
    return address[len("unix:") :]


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def assert_disconnected(sock: socket.socket) -> None:
    """The peer closes the connection without sending anything more."""
    try:
        rest = sock.recv(4096)
    except ConnectionResetError:
        return
    assert rest == b""


def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


@pytest.fixture
def echo(procs1):
    e = procs1.spawn("echo", Echo)
    assert e.echo.call_one("warm").get(timeout=10) == "warm"
    return e


def _stranger_targets(echo):
    return {"client": client_socket_path(), "worker": echo.address.call_one().get(timeout=10)[len("unix:") :]}


@pytest.mark.parametrize("target", ["client", "worker"])
def test_wrong_secret_is_disconnected(echo, target):
    path = _stranger_targets(echo)[target]
    with connect(path) as s:
        challenge = recv_exactly(s, CHALLENGE_BYTES)
        assert challenge.startswith(MAGIC)
        # A well-formed answer computed with a secret the server does not share.
        import hashlib
        import hmac

        nonce_c = os.urandom(32)
        proof = hmac.digest(os.urandom(32), b"C" + challenge[5:] + nonce_c, hashlib.sha256)
        s.sendall(nonce_c + proof)
        assert_disconnected(s)
    assert echo.echo.call_one(target).get(timeout=10) == target


@pytest.mark.parametrize("target", ["client", "worker"])
def test_garbage_bytes_are_disconnected(echo, target):
    path = _stranger_targets(echo)[target]
    with connect(path) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: monarch\r\n\r\n" + os.urandom(200))
        data = b""
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        # At most the server's challenge, never a proof that it accepted us.
        assert len(data) <= CHALLENGE_BYTES
    assert echo.echo.call_one([1, 2, 3]).get(timeout=10) == [1, 2, 3]


def test_silent_stranger_does_not_block_others(echo):
    with connect(client_socket_path()) as s:
        assert recv_exactly(s, CHALLENGE_BYTES).startswith(MAGIC)
        # The stranger holds its connection open while real traffic flows.
        for i in range(20):
            assert echo.echo.call_one(i).get(timeout=10) == i


def test_malformed_frame_after_handshake_closes_only_that_connection(echo):
    """Even an authenticated peer cannot crash the runtime with a bad frame."""
    import hashlib
    import hmac

    from monarch._src.actor.process_state import runtime

    secret = runtime().secret
    with connect(client_socket_path()) as s:
        challenge = recv_exactly(s, CHALLENGE_BYTES)
        nonce_s, nonce_c = challenge[5:], os.urandom(32)
        s.sendall(nonce_c + hmac.digest(secret, b"C" + nonce_s + nonce_c, hashlib.sha256))
        assert len(recv_exactly(s, 32)) == 32  # the server's proof: we are in
        s.sendall(struct.pack("<I", 8) + b"\xc1" * 8)  # 0xc1 is never valid msgpack
        assert_disconnected(s)
    assert echo.echo.call_one("still fine").get(timeout=10) == "still fine"


OVERSIZE_SCRIPT = textwrap.dedent(
    """
    import os
    from monarch.actor import Actor, ActorError, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def length(self, data):
            return len(data)

        @endpoint
        def big(self, n):
            return b"y" * n

    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        e = pm.spawn("echo", Echo)
        print("small", e.length.call_one(b"x" * 1000).get(timeout=10), flush=True)
        try:
            e.length.call_one(b"x" * 2_000_000).get(timeout=10)
            print("send: no error", flush=True)
        except Exception as err:
            print("send:", type(err).__name__, repr(str(err)), flush=True)
        try:
            e.big.call_one(2_000_000).get(timeout=10)
            print("reply: no error", flush=True)
        except Exception as err:
            print("reply:", type(err).__name__, repr(str(err)), flush=True)
        print("after", e.length.call_one(b"x" * 10).get(timeout=10), flush=True)
    finally:
        pm.stop().get(timeout=10)
    """
)


def _run_oversize_script() -> dict:
    env = dict(os.environ, MONARCH_MAX_FRAME_BYTES="500000")
    proc = subprocess.run(
        [sys.executable, "-c", OVERSIZE_SCRIPT], capture_output=True, text=True, timeout=45, cwd=REPO, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}


def test_oversize_frame_is_a_clear_error_at_the_call_site():
    lines = _run_oversize_script()
    assert lines.get("small") == "small 1000"
    send = lines["send:"]
    assert "rejecting oversize frame" in send and "HINT" in send
    assert lines.get("after") == "after 10"


def test_oversize_reply_is_an_actor_error_at_the_caller():
    lines = _run_oversize_script()
    reply = lines["reply:"]
    assert reply.startswith("reply: ActorError"), reply
    assert "rejecting oversize frame" in reply
    assert lines.get("after") == "after 10"
