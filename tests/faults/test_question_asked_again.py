"""A replacement connection that closed before its question was answered: the next one asks it
again, naming the same connection.

When a connection to a live peer drops, the sender reconnects and the new connection's hello
asks how many of the frames written on the old one were read; it writes nothing but its hello
until the answer comes (``transport.read_count``). If it drops before that, the peer may never
have read its hello (lost in a reset), and then still takes the old connection for the
sender's previous one. Asked about the replacement ("0 frames written"), it answered that none
of the old connection's frames were read, though it had read them: the sender sent them all
again, and each ran twice (and frames it no longer kept were reported lost). The next hello
asks again what the replacement asked, naming the old connection by its handshake's nonce.

The receiver here is this test, on a raw listener; the sender is this process's runtime.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import msgpack
import pytest

from monarch._src.actor.process_state import runtime
from monarch._src.transport import auth, read_count
from monarch._src.wire import protocol
from monarch._src.wire.frame import PREFIX
from monarch._src.wire.protocol import PEER_HELLO_KIND, PREVIOUS_CONNECTION, PREVIOUS_FRAMES, RANK, message

pytestmark = pytest.mark.timeout(60)

#: What a hello asks (every field but the kind and the sender), the connection it names included.
QUESTION = set(protocol.FIELDS[PEER_HELLO_KIND]) - {protocol.SENDER}


class RawReceiver:
    """A listener of this job that authenticates connections as a monarch process does, and
    reads their frames."""

    def __init__(self) -> None:
        self._secret = runtime().secret
        path = runtime().new_socket_path()
        self.address = f"unix:{path}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(8)
        self._listener.settimeout(20)

    def accept(self) -> tuple[socket.socket, bytes]:
        """The next connection, authenticated, and the nonce its sender chose."""
        conn, _ = self._listener.accept()
        conn.settimeout(20)
        nonce_s = auth.new_nonce()
        conn.sendall(auth.challenge(nonce_s))
        nonce_c = auth.check_client_proof(self._secret, nonce_s, read_exactly(conn, auth.CLIENT_PROOF_BYTES))
        conn.sendall(auth.server_proof(self._secret, nonce_c, nonce_s))
        return conn, nonce_c

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def receiver() -> Iterator[RawReceiver]:
    raw = RawReceiver()
    yield raw
    raw.close()


def read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "the sender closed the connection"
        data += chunk
    return data


def read_frame(conn: socket.socket) -> dict:
    """The header of the next frame on ``conn`` (its bodies read and dropped)."""
    (size,) = PREFIX.unpack(read_exactly(conn, PREFIX.size))
    header = msgpack.unpackb(read_exactly(conn, size), raw=False, strict_map_key=False)
    for length in header["b"]:
        read_exactly(conn, length)
    return header


def send(address: str, seq: int) -> None:
    """Message ``seq`` from this process's runtime (its rank field numbers it)."""
    runtime().send(address, message("recorder", "record", None, seq, [[], []]), [])


def sequence(conn: socket.socket, n: int) -> list[int]:
    return [read_frame(conn)[RANK] for _ in range(n)]


def test_the_next_hello_asks_again_what_the_unanswered_one_asked(receiver: RawReceiver) -> None:
    """Connection A carries messages 0-2, all read, and drops; B's hello (never answered) asks
    about A; B drops; C's hello asks the same, naming A (it asked about B: "0 frames written").
    Told that 1 was read, C sends 1 and 2 again, then 3: each once."""
    for seq in range(3):
        send(receiver.address, seq)
    a, a_nonce = receiver.accept()
    assert PREVIOUS_FRAMES not in read_frame(a)  # A's hello asks nothing
    assert sequence(a, 3) == [0, 1, 2]
    a.close()
    b, _ = receiver.accept()
    asked = read_frame(b)  # as if lost in a reset: never answered
    assert asked[PREVIOUS_FRAMES] == 3 and asked[PREVIOUS_CONNECTION] == a_nonce, asked
    b.close()
    c, _ = receiver.accept()
    again = read_frame(c)
    assert again["k"] == PEER_HELLO_KIND
    assert {key: again.get(key) for key in QUESTION} == {key: asked.get(key) for key in QUESTION}
    c.sendall(read_count.RECORD.pack(read_count.PREVIOUS, 1))
    send(receiver.address, 3)
    assert sequence(c, 3) == [1, 2, 3]
    c.close()
