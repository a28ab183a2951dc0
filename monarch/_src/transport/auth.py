"""Mutual HMAC challenge-response on a per-job secret.

Payloads are pickles, so whoever can get a frame decoded can run code in the receiver. No
frame is decoded before both sides have proved they hold the job secret, and the secret never
crosses the wire. The exchange, with fresh 32-byte nonces on each side:

    server -> client   MAGIC VERSION nonce_s                      (37 bytes)
    client -> server   nonce_c HMAC(secret, "C" nonce_s nonce_c)  (64 bytes)
    server -> client   HMAC(secret, "S" nonce_c nonce_s)          (32 bytes)

The client sends its nonce as soon as it is connected, without waiting for the challenge (the
server reads the 64 bytes either way): so a plaintext client always speaks first, and a TLS
listener, which waits for a TLS ClientHello, can tell it at once that it speaks TLS only
(``TLS_ONLY``) instead of both sides waiting for the other until a timeout.
"""

from __future__ import annotations

import hashlib
import hmac
import os

MAGIC = b"MNRC"
VERSION = 1
NONCE_BYTES = 32
DIGEST_BYTES = 32

CHALLENGE_BYTES = len(MAGIC) + 1 + NONCE_BYTES
CLIENT_PROOF_BYTES = NONCE_BYTES + DIGEST_BYTES
SERVER_PROOF_BYTES = DIGEST_BYTES
#: What a TLS listener answers a client that speaks plaintext, before it hangs up (one line).
TLS_ONLY = MAGIC[:3] + b"T this listener accepts TLS connections only\n"


class HandshakeError(Exception):
    """The peer failed the handshake: wrong secret, wrong protocol, or not a monarch peer."""


def new_secret() -> bytes:
    return os.urandom(32)


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def challenge(nonce_s: bytes) -> bytes:
    return MAGIC + bytes([VERSION]) + nonce_s


def parse_challenge(data: bytes) -> bytes:
    if data[: len(MAGIC)] != MAGIC:
        raise HandshakeError("peer is not a monarch endpoint (bad magic)")
    if data[len(MAGIC)] != VERSION:
        raise HandshakeError(
            f"peer speaks wire version {data[len(MAGIC)]}, this process speaks {VERSION}\n"
            "HINT: run the same monarch-aio version on every process of a job."
        )
    return bytes(data[len(MAGIC) + 1 :])


def client_proof(secret: bytes, nonce_s: bytes, nonce_c: bytes) -> bytes:
    return nonce_c + client_digest(secret, nonce_s, nonce_c)


def client_digest(secret: bytes, nonce_s: bytes, nonce_c: bytes) -> bytes:
    """The second half of the client's proof (its nonce, the first half, went out before)."""
    return hmac.digest(secret, b"C" + nonce_s + nonce_c, hashlib.sha256)


def check_client_proof(secret: bytes, nonce_s: bytes, data: bytes) -> bytes:
    """Verify the client's proof; return its nonce."""
    nonce_c, digest = bytes(data[:NONCE_BYTES]), bytes(data[NONCE_BYTES:])
    if not hmac.compare_digest(digest, hmac.digest(secret, b"C" + nonce_s + nonce_c, hashlib.sha256)):
        raise HandshakeError("client failed authentication (wrong job secret)")
    return nonce_c


def server_proof(secret: bytes, nonce_c: bytes, nonce_s: bytes) -> bytes:
    return hmac.digest(secret, b"S" + nonce_c + nonce_s, hashlib.sha256)


def check_server_proof(secret: bytes, nonce_c: bytes, nonce_s: bytes, data: bytes) -> None:
    if not hmac.compare_digest(bytes(data), server_proof(secret, nonce_c, nonce_s)):
        raise HandshakeError("server failed authentication (wrong job secret)")


def _keystream(secret: bytes, nonce: bytes, size: int) -> bytes:
    blocks = (
        hmac.digest(secret, b"seal" + nonce + i.to_bytes(4, "big"), hashlib.sha256)
        for i in range(size // 32 + 1)
    )
    return b"".join(blocks)[:size]


def seal(secret: bytes, message: bytes) -> tuple[bytes, bytes]:
    """``(nonce, sealed)``: ``message`` hidden from anyone without ``secret`` (a one-time pad
    from HMAC under a fresh nonce). How a client hands its job secret to a host agent that
    authenticated it, so that an eavesdropper on that connection does not learn it."""
    nonce = new_nonce()
    return nonce, bytes(a ^ b for a, b in zip(message, _keystream(secret, nonce, len(message))))


def unseal(secret: bytes, nonce: bytes, sealed: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(sealed, _keystream(secret, nonce, len(sealed))))
