"""Monarch's names for bootstrapping hosts: ``run_worker_loop_forever`` and ``attach_to_workers``.

``run_worker_loop_forever`` runs a host agent in this process (what ``python -m monarch.host``
runs); ``attach_to_workers`` attaches a client to such agents and returns their ``HostMesh``
at once. Both authenticate with the shared host secret when one is configured
(``MONARCH_HOST_SECRET`` or ``MONARCH_HOST_SECRET_FILE``: our own agents' default); without
one, ``ca="trust_all_connections"`` lets any client attach, as in Monarch. A CA file as ``ca``
with ``private_key`` makes every connection of the job mutual TLS (the ``tls_*`` settings).
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
_warned_exposed = False


def host_address(address: str) -> str:
    """Our form of an agent address, from Monarch's ZMQ-style ones too (``ipc://path``,
    ``tcp://host:port``)."""
    if address.startswith("ipc://"):
        return "unix:" + address[len("ipc://") :]
    if address.startswith("tcp://"):
        return "tcp:" + address[len("tcp://") :]
    return address


def host_secret(ca: str, private_key: Any, addresses: Sequence[str]) -> bytes:
    """The secret connections to or from host agents use (see the module docstring); with
    ``ca`` a CA file and ``private_key`` a PEM file of this process's certificate and key,
    every connection of the job is mutual TLS too (see ``use_tls``)."""
    from monarch._src.host.agent import TRUST_ALL_SECRET, read_secret

    if ca != TRUST_ALL or private_key is not None:
        use_tls(ca, private_key)
    secret = read_secret()
    if secret is not None:
        return secret
    from monarch._src.transport.address import is_loopback  # socket: not on `import monarch.actor`

    global _warned_exposed
    exposed = [a for a in addresses if not is_loopback(a)]
    if ca == TRUST_ALL and exposed and not _warned_exposed:
        _warned_exposed = True
        warnings.warn(
            f"ca={TRUST_ALL!r} without a shared secret: any client that can reach {exposed[0]} "
            "may run code there. HINT: set MONARCH_HOST_SECRET or MONARCH_HOST_SECRET_FILE on "
            "both sides, or give ca (a CA file) and private_key for mutual TLS.",
            stacklevel=3,
        )
    return TRUST_ALL_SECRET


def use_tls(ca: str, private_key: Any) -> None:
    """Monarch's mutual TLS: this process (and the procs it starts) present the certificate in
    ``private_key`` (one PEM file with the certificate and its key) and accept only peers whose
    certificate the CA in ``ca`` signed. Must come before this process's runtime starts."""
    from monarch._src.runtime.config import CONFIG, configure
    from monarch._src.runtime.runtime import Runtime

    if ca == TRUST_ALL or not private_key:
        raise ValueError(
            f"mutual TLS takes both ca (a CA file) and private_key (a PEM file with this "
            f"process's certificate and key); got ca={ca!r}, private_key={private_key!r}\n"
            f"HINT: ca={TRUST_ALL!r} with private_key=None turns TLS off."
        )
    wanted = {"tls_ca": str(ca), "tls_cert": str(private_key), "tls_key": str(private_key)}
    if all(getattr(CONFIG, k) == v for k, v in wanted.items()):
        return
    if Runtime.current() is not None:
        raise RuntimeError(
            "TLS must be set up before this process's monarch runtime starts, and it has started "
            "without it\nHINT: call attach_to_workers / run_worker_loop_forever with ca and "
            "private_key before any other monarch call, or set MONARCH_TLS_CERT, MONARCH_TLS_KEY "
            "and MONARCH_TLS_CA."
        )
    configure(**wanted)


def run_worker_loop_forever(*, private_key: Any = None, ca: str, address: str) -> None:
    """Serve as a host agent on ``address`` (``unix:/path``, or Monarch's ``ipc:///path``)
    until the process is signalled; every client that attaches gets its own session, torn
    down when it goes away."""
    from monarch._src.host.agent import listen_on, log_to_stderr, serve

    address = host_address(address)
    secret = host_secret(ca, private_key, [address])
    log_to_stderr()
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
