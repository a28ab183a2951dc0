"""Optional TLS on TCP: with a certificate, its key and a CA configured, every TCP connection
is TLS with mutual certificate verification, and the HMAC handshake runs inside it. A peer
without a valid certificate is refused with a logged reason, and a caller gets a clear error
at once, not a hang. Connections still in their TLS handshake count among the pending
handshakes, whose number is capped as on Unix sockets."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import REPO, wait_until
from tcp_helpers import recv_exactly, tls_env

from monarch._src.transport import tls
from monarch._src.transport.address import TcpAddress, parse
from monarch._src.transport.listener import MAX_PENDING_HANDSHAKES

#: A client on TLS: spawns one proc (with argv[1]'s environment overrides) and calls it with
#: 8 MiB; prints RESULT; then, if that worked, serves until its stdin closes.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    import monarch.actor
    from monarch.actor import Actor, endpoint, enable_transport, this_host
    from monarch._src.actor.process_state import runtime
    from monarch._src.runtime import framework_log

    enable_transport("tls")
    failures = []
    monarch.actor.unhandled_fault_hook = lambda failure: failures.append(str(failure))

    class Node(Actor):
        @endpoint
        async def nbytes(self, a):
            return a.nbytes

    out = {}
    pm = this_host().spawn_procs(per_host={"gpus": 1}, env=json.loads(sys.argv[1]))
    node = pm.spawn("node", Node)
    start = time.monotonic()
    try:
        out["call"] = node.nbytes.call_one(np.ones(8 << 20, np.uint8)).get(timeout=30)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = time.monotonic() - start
    out["failures"] = failures
    out["address"] = runtime().address
    out["log"] = framework_log.log_file()
    print("RESULT", json.dumps(out), flush=True)
    if "call" in out:
        sys.stdin.read()
    pm.stop().get(timeout=10)
    """
)


IDLE_STRANGERS = 1000


def start_client(
    certs: dict[str, str], worker_env: dict[str, str]
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    import os

    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(worker_env)],
        cwd=REPO,
        env={**os.environ, **tls_env(certs)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("RESULT "):
            return proc, json.loads(line[len("RESULT ") :])
    _, err = proc.communicate(timeout=30)
    pytest.fail(f"the client printed no result: {err}")


def finish(proc: subprocess.Popen[str]) -> str:
    _, err = proc.communicate(input="", timeout=30)
    assert proc.returncode == 0, err
    return err


def host_port(address: str) -> tuple[str, int]:
    parsed = parse(address)
    assert isinstance(parsed, TcpAddress)
    return parsed.host, parsed.port


def first_bytes_over_tls(address: str, ca: str, cert: tuple[str, str] | None = None) -> bytes:
    """What a TLS client that trusts the CA, showing ``cert`` (certificate, key) or none, gets
    to read (TLS 1.3 finishes the client's side of the handshake before the server checks it)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    with socket.create_connection(host_port(address), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as s:
                return s.recv(64)
        except (ssl.SSLError, ConnectionResetError) as e:
            return repr(e).encode()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_tls_job_works_and_refuses_peers_without_a_valid_certificate(certs: dict[str, str]) -> None:
    proc, out = start_client(certs, {})
    try:
        assert out.get("call") == 8 << 20, out
        address = out["address"]
        assert address.startswith("tcp:127.0.0.1:")
        # Plaintext gets no challenge: the listener speaks TLS only.
        with socket.create_connection(host_port(address), timeout=10) as s:
            s.sendall(b"hello, is this monarch?\r\n")
            assert not recv_exactly(s, 64).startswith(b"MNRC")
        # A TLS client without a certificate never gets the challenge either, and is logged.
        assert not first_bytes_over_tls(address, certs["ca"]).startswith(b"MNRC")
        log = Path(out["log"])
        wait_until(
            lambda: log.exists() and "PEER_DID_NOT_RETURN_A_CERTIFICATE" in log.read_text(),
            what="the refusal of the peer without a certificate to be logged",
        )
        # Strangers that never start TLS count among the pending handshakes, whose number is
        # capped; a peer with a valid certificate still gets the challenge after them.
        strangers = [socket.create_connection(host_port(address), timeout=10) for _ in range(IDLE_STRANGERS)]
        try:
            cert = (certs["node.pem"], certs["node.key"])
            assert first_bytes_over_tls(address, certs["ca"], cert).startswith(b"MNRC")
            fds = psutil.Process(proc.pid).num_fds()
            assert fds < MAX_PENDING_HANDSHAKES + 64, f"{fds} descriptors open for {IDLE_STRANGERS} strangers"
        finally:
            for s in strangers:
                s.close()
    finally:
        finish(proc)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_proc_with_a_certificate_of_another_ca_is_a_clear_error_at_once(certs: dict[str, str]) -> None:
    proc, out = start_client(
        certs, {"MONARCH_TLS_CERT": certs["rogue.pem"], "MONARCH_TLS_KEY": certs["rogue.key"]}
    )
    finish(proc)
    error = out.get("error", "")
    assert "TLS handshake" in error and "certificate verify failed" in error, out
    assert "HINT" in error and "MONARCH_TLS_CA" in error
    assert out["seconds"] < 5, out


def test_half_configured_tls_names_what_is_missing(certs: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="tls_key, tls_ca not set"):
        tls.contexts(certs["node.pem"], "", "")
    assert tls.contexts("", "", "") is None
    with pytest.raises(ValueError, match="cannot load the TLS files"):
        tls.contexts(certs["node.pem"], certs["rogue.key"], certs["ca"])
