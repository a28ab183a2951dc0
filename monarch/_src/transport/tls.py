"""Optional TLS for TCP connections (stdlib ``ssl``), with mutual certificate verification.

When a certificate, its key and a CA file are configured, every TCP connection is TLS: each
side presents its certificate and accepts only a peer whose certificate the CA signed. Host
names are not checked (a job's processes move between machines and reach each other by IP
address): the CA says who belongs to the cluster, and the job secret, proved by the HMAC
handshake that still runs inside TLS, says who belongs to the job. Unix sockets never use TLS.

A failed TLS handshake is not worth retrying (the certificates will not change): the outgoing
side fails the connection at once (``outgoing.TlsError``), with a message that says what to check.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Plaintext of small buffers is joined up to this size before it is encrypted, so a frame
#: (prefix, header, small body) becomes one TLS record, not three.
COALESCE_BYTES = 16 * 1024
#: The first byte of a TLS handshake record, which a TLS client's first message starts with.
HANDSHAKE_RECORD = 0x16

HINT = (
    "HINT: every process of the job needs a certificate signed by the CA that the others trust "
    "(settings tls_cert, tls_key and tls_ca; environment MONARCH_TLS_CERT, MONARCH_TLS_KEY, "
    "MONARCH_TLS_CA)."
)


@dataclass(frozen=True)
class TlsContexts:
    """The two sides of this process's TLS: accepting and connecting."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def contexts(cert: str, key: str, ca: str) -> TlsContexts | None:
    """The contexts for the configured files, None when TLS is off (no file configured).
    ValueError, saying which setting is missing or unreadable, for a partial configuration."""
    given = {"tls_cert": cert, "tls_key": key, "tls_ca": ca}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise ValueError(f"TLS is half configured: {', '.join(missing)} not set\n{HINT}")
    made = []
    for purpose in (ssl.Purpose.CLIENT_AUTH, ssl.Purpose.SERVER_AUTH):
        ctx = ssl.SSLContext(
            ssl.PROTOCOL_TLS_SERVER if purpose is ssl.Purpose.CLIENT_AUTH else ssl.PROTOCOL_TLS_CLIENT
        )
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            ctx.load_cert_chain(cert, key)
            ctx.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(
                f"cannot load the TLS files (tls_cert={cert!r}, tls_key={key!r}, tls_ca={ca!r}): {e}\n{HINT}"
            ) from None
        made.append(ctx)
    server, client = made
    client.sslsocket_class = SendmsgSSLSocket
    return TlsContexts(server, client)


def _chunks(buffers: list[Any]) -> Iterator[Any]:
    """The buffers as they are encrypted: small ones joined, large ones as they are."""
    pending = bytearray()
    for b in buffers:
        view = memoryview(b).cast("B")
        if view.nbytes >= COALESCE_BYTES:
            if pending:
                yield pending
                pending = bytearray()
            yield view
        else:
            pending += view
            if len(pending) >= COALESCE_BYTES:
                yield pending
                pending = bytearray()
    if pending:
        yield pending


class SendmsgSSLSocket(ssl.SSLSocket):
    """A client TLS socket with the one socket call ``outgoing`` writes with, ``sendmsg``.

    Non-blocking like the plain socket: it returns how much of the plaintext went out (TLS
    records are written whole, so the rest is for the next call, starting with the same bytes)
    and raises BlockingIOError when nothing could be written.
    """

    def sendmsg(self, buffers: Any, *args: Any, **kwargs: Any) -> int:  # type: ignore[override]
        total = 0
        for chunk in _chunks(list(buffers)):
            try:
                n = self.send(chunk)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                if total:
                    return total
                raise BlockingIOError from None
            total += n
            if n < len(chunk):
                break
        return total
