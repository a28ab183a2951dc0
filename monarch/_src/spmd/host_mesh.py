"""``host_mesh_from_store``: from inside a running torchrun job, an actor mesh over its nodes.

Every rank of the job calls it with the job's store (a ``torch.distributed.Store``, or anything
with blocking ``get(key)`` and ``set(key, value)``). The local rank 0 of each node starts a
host agent (``python -m monarch.host``) that exits with it, and publishes the agent's address
under ``monarch/spmd/workers/<group rank>``; global rank 0 attaches to all of them and gets a
``{"hosts": nodes}`` HostMesh, every other rank gets None.

The agents' secret never passes through the store in the clear: global rank 0 and each node's
local rank 0 agree on a key by Diffie-Hellman over the store (2048-bit MODP group of RFC 3526,
fresh exponents per call), and rank 0 publishes the host secret only one-time-padded with
that key. Whoever can read the store (any process that reaches its port, since torch's store
has no authentication) learns nothing that lets it attach. Whoever can *write* the store can
already take over the job (it runs torch's rendezvous), so the store is trusted for integrity
as much as the job itself; this bridge adds no way in beyond that.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Protocol

from monarch._src.host.host_mesh import HostMesh, attach
from monarch._src.host.workers import host_address

#: Monarch's transports for the agents (``ipc``: Unix sockets, one machine; ``tcp``: a fixed
#: port on every node).
TRANSPORTS = ("ipc", "tcp")
KEY_PREFIX = "monarch/spmd/"

# RFC 3526 group 14 (a 2048-bit safe prime) with generator 2.
_MODP_2048 = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
    "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B"
    "0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA4836"
    "1C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804"
    "F1746C08CA18217C32905E462E36CE3BE39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6"
    "955817183995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF",
    16,
)
_EXPONENT_BITS = 320
SECRET_BYTES = 32


class Store(Protocol):
    """What is used of a ``torch.distributed.Store``: ``get`` blocks until the key is set."""

    def set(self, key: str, value: Any) -> None: ...

    def get(self, key: str) -> bytes: ...


class _KeyPair:
    """One side of a Diffie-Hellman exchange."""

    def __init__(self) -> None:
        self._exponent = secrets.randbits(_EXPONENT_BITS) | 1 << (_EXPONENT_BITS - 1)
        self.public = str(pow(2, self._exponent, _MODP_2048))

    def shared_pad(self, peer_public: bytes, what: str) -> bytes:
        """A 32-byte key only the two ends know, from the peer's public value."""
        value = int(peer_public)
        if not 1 < value < _MODP_2048 - 1:
            raise RuntimeError(f"host_mesh_from_store: the store holds a malformed public key for {what}")
        shared = pow(value, self._exponent, _MODP_2048)
        return hashlib.sha256(b"monarch spmd host secret" + shared.to_bytes(256, "big")).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


@dataclass(frozen=True)
class _Job:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @property
    def nodes(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def group_rank(self) -> int:
        return self.rank // self.local_world_size


def _from_env(name: str, given: int | None) -> int:
    if given is not None:
        return given
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(
            f"host_mesh_from_store requires the {name} env var (or the {name.lower()}= argument)\n"
            "HINT: call it from a script started by torchrun or python -m monarch.launch."
        )
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"host_mesh_from_store: {name}={value!r} is not an integer") from None


def _job(
    rank: int | None, local_rank: int | None, world_size: int | None, local_world_size: int | None
) -> _Job:
    job = _Job(
        _from_env("RANK", rank),
        _from_env("LOCAL_RANK", local_rank),
        _from_env("WORLD_SIZE", world_size),
        _from_env("LOCAL_WORLD_SIZE", local_world_size),
    )
    if job.local_world_size <= 0 or job.world_size % job.local_world_size:
        raise ValueError(
            f"host_mesh_from_store: WORLD_SIZE ({job.world_size}) must be divisible by LOCAL_WORLD_SIZE "
            f"({job.local_world_size}): one host per node takes the same number of ranks on every node"
        )
    return job


class _LocalAgent:
    """The host agent a node's local rank 0 runs for the job, listening for rank 0 only."""

    def __init__(self, secret: bytes, transport: str, port: int, name: str) -> None:
        from monarch._src.host.hosts_config import start_local_agent
        from monarch._src.runtime.config import CONFIG
        from monarch._src.transport.address import listen_tcp, listen_unix

        self.directory: str | None = None
        if transport == "ipc":
            self.directory = tempfile.mkdtemp(prefix="monarch_worker_")
            sock = listen_unix(os.path.join(self.directory, name))
        else:
            sock = listen_tcp(CONFIG.tcp_bind_host, port)
        self.address, self.proc = start_local_agent(sock, secret, os.environ)
        atexit.register(self.stop)

    def stop(self) -> None:
        """At this rank's exit: the agent ends with it (it would by itself, a moment later)."""
        from monarch._src.host.spawner import reap

        if self.proc.poll() is None:
            self.proc.terminate()
        reap([self.proc], 5.0)
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def host_mesh_from_store(
    store: Store,
    *,
    monarch_port: int = 0,
    name: str = "monarch_worker",
    transport: str = "ipc",
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    local_world_size: int | None = None,
) -> HostMesh | None:
    """Called by every rank of a torchrun / ``python -m monarch.launch`` job: a
    ``{"hosts": nodes}`` HostMesh for global rank 0, None for the others. Keep every node's
    local rank 0 running while rank 0 uses the mesh: each node's agent exits with it."""
    if transport not in TRANSPORTS:
        raise ValueError(
            f"host_mesh_from_store: unknown transport {transport!r}\nHINT: use one of {TRANSPORTS}."
        )
    if transport == "tcp" and not monarch_port:
        raise ValueError(
            "host_mesh_from_store: transport='tcp' needs an explicit monarch_port (the same on every node)\n"
            "HINT: pass monarch_port=<a port free on every node>, e.g. 26600."
        )
    job = _job(rank, local_rank, world_size, local_world_size)
    primary = job.rank == 0
    if primary:
        if transport == "tcp":
            from monarch._src.runtime.transport_choice import enable_transport

            try:
                enable_transport("tcp")  # the agents' sessions connect back to this process
            except RuntimeError as e:
                raise RuntimeError(
                    f"host_mesh_from_store(transport='tcp'): {e}\nHINT: under python -m monarch.launch "
                    "each rank is a monarch proc already listening on a Unix socket: use transport='ipc' "
                    "(one machine), or start the job with torchrun for tcp."
                ) from None
        client = _KeyPair()
        store.set(KEY_PREFIX + "client_key", client.public)
    if job.local_rank == 0:
        node = _KeyPair()
        client_public = store.get(KEY_PREFIX + "client_key")
        store.set(KEY_PREFIX + f"node_key/{job.group_rank}", node.public)
    if primary:
        secret = secrets.token_bytes(SECRET_BYTES)
        for group in range(job.nodes):
            pad = client.shared_pad(store.get(KEY_PREFIX + f"node_key/{group}"), f"node {group}")
            store.set(KEY_PREFIX + f"sealed/{group}", _xor(secret, pad).hex())
    if job.local_rank == 0:
        pad = node.shared_pad(client_public, "rank 0")
        node_secret = _xor(bytes.fromhex(store.get(KEY_PREFIX + f"sealed/{job.group_rank}").decode()), pad)
        try:
            agent = _LocalAgent(node_secret, transport, monarch_port, name)
        except OSError as e:
            store.set(KEY_PREFIX + f"workers/{job.group_rank}", f"error:{e}")
            raise RuntimeError(
                f"host_mesh_from_store: could not start the host agent of node {job.group_rank}: {e}"
            ) from e
        store.set(KEY_PREFIX + f"workers/{job.group_rank}", agent.address)
    if not primary:
        return None
    addresses = []
    for group in range(job.nodes):
        address = store.get(KEY_PREFIX + f"workers/{group}").decode()
        if address.startswith("error:"):
            raise RuntimeError(
                f"host_mesh_from_store: node {group} could not start its host agent: {address[len('error:') :]}"
            )
        addresses.append(host_address(address))
    return attach(addresses, secret, name)
