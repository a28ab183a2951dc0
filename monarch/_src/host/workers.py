"""Monarch's names for bootstrapping hosts: ``run_worker_loop_forever`` and ``attach_to_workers``.

``run_worker_loop_forever`` runs a host agent in this process (what ``python -m monarch.host``
runs); ``attach_to_workers`` attaches a client to such agents and returns their ``HostMesh``
at once. Both authenticate with the shared host secret when one is configured
(``MONARCH_HOST_SECRET`` or ``MONARCH_HOST_SECRET_FILE``: our own agents' default); without
one, ``ca="trust_all_connections"`` lets any client attach, as in Monarch. A certificate
authority (mutual TLS) is not supported yet.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from monarch._src.actor.future import Future
from monarch._src.host.host_mesh import HostMesh, attach

# The agent module (and asyncio with it) is imported when first used: ``import monarch.actor``
# stays light.

TRUST_ALL = "trust_all_connections"
_LOOPBACK_HOSTS = ("127.", "localhost", "[::1]", "::1")
_warned_exposed = False


def host_address(address: str) -> str:
    """Our form of an agent address, from Monarch's ZMQ-style ones too (``ipc://path``,
    ``tcp://host:port``)."""
    if address.startswith("ipc://"):
        return "unix:" + address[len("ipc://") :]
    if address.startswith("tcp://"):
        return "tcp:" + address[len("tcp://") :]
    return address


def is_loopback(address: str) -> bool:
    """Whether only this machine reaches ``address`` (a Unix socket, or TCP on loopback)."""
    if address.startswith("unix:"):
        return True
    host = address[len("tcp:") :] if address.startswith("tcp:") else address
    return host.startswith(_LOOPBACK_HOSTS)


def host_secret(ca: str, private_key: Any, addresses: Sequence[str]) -> bytes:
    """The secret connections to or from host agents use (see the module docstring)."""
    if private_key is not None or ca != TRUST_ALL:
        raise NotImplementedError(
            "TLS security plumbing: a certificate authority and private key are not supported yet\n"
            f"HINT: use ca={TRUST_ALL!r}, with a shared secret in MONARCH_HOST_SECRET or "
            "MONARCH_HOST_SECRET_FILE to keep strangers out."
        )
    from monarch._src.host.agent import TRUST_ALL_SECRET, read_secret

    secret = read_secret()
    if secret is not None:
        return secret
    global _warned_exposed
    exposed = [a for a in addresses if not is_loopback(a)]
    if exposed and not _warned_exposed:
        _warned_exposed = True
        warnings.warn(
            f"ca={TRUST_ALL!r} without a shared secret: any client that can reach {exposed[0]} "
            "may run code there. HINT: set MONARCH_HOST_SECRET or MONARCH_HOST_SECRET_FILE on "
            "both sides.",
            stacklevel=3,
        )
    return TRUST_ALL_SECRET


def run_worker_loop_forever(*, private_key: Any = None, ca: str, address: str) -> None:
    """Serve as a host agent on ``address`` (``unix:/path``, or Monarch's ``ipc:///path``)
    until the process is signalled; every client that attaches gets its own session, torn
    down when it goes away."""
    from monarch._src.host.agent import listen_on, serve

    address = host_address(address)
    secret = host_secret(ca, private_key, [address])
    serve(listen_on(address), secret)


def attach_to_workers(
    *, private_key: Any = None, ca: str, workers: Sequence[str | Future[str]], name: str | None = None
) -> HostMesh:
    """A ``{"hosts": len(workers)}`` mesh of the agents at ``workers``, returned at once;
    ``initialized`` fails, naming the address, if one cannot be attached to. A worker given
    as a Future is waited for first."""
    addresses = [host_address(w if isinstance(w, str) else w.get()) for w in workers]
    secret = host_secret(ca, private_key, addresses)
    return attach(addresses, secret, name)
