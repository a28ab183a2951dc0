"""TLS configured on one side only, or a certificate the other side refuses: a clear error
within a second or two that names what is wrong, not a retry until MONARCH_PEER_UNREACHABLE_S.

A plaintext client speaks first (its nonce), so a TLS listener tells it at once that it takes
TLS only; a TLS client reads a plain listener's challenge as a plaintext answer; a TLS 1.3
server refuses a client certificate by hanging up right after the handshake, which the client
takes as a refusal once it happened a few times in a row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO
from tcp_helpers import tls_env

#: Spawns one proc with argv[2]'s environment overrides on transport argv[1], calls it, prints
#: RESULT with the error and how long the call took.
SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import monarch.actor
    from monarch.actor import Actor, endpoint, enable_transport, this_host

    enable_transport(sys.argv[1])
    monarch.actor.unhandled_fault_hook = lambda failure: None

    class Node(Actor):
        @endpoint
        async def ping(self):
            return "pong"

    pm = this_host().spawn_procs(per_host={"gpus": 1}, env=json.loads(sys.argv[2]))
    node = pm.spawn("node", Node)
    out = {}
    start = time.monotonic()
    try:
        out["call"] = node.ping.call_one().get(timeout=60)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["seconds"] = time.monotonic() - start
    print("RESULT", json.dumps(out), flush=True)
    pm.stop().get(timeout=10)  # (5 s: the proc it cannot reach is killed after the stop timeout)
    """
)

NO_TLS = {"MONARCH_TLS_CERT": "", "MONARCH_TLS_KEY": "", "MONARCH_TLS_CA": ""}


def call_across(transport: str, client_env: dict[str, str], worker_env: dict[str, str]) -> dict:
    """What a client with ``client_env`` gets calling a proc with ``worker_env``. The bound on
    unreachable peers stays the default (120 s): the test's timeout is far below it."""
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_PEER_UNREACHABLE_S"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, transport, json.dumps(worker_env)],
        cwd=REPO,
        env={**env, **client_env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    pytest.fail(f"the client printed no result: {proc.stderr}")


def assert_clear_tls_error(out: dict, *phrases: str) -> None:
    error = out.get("error", "")
    for phrase in phrases:
        assert phrase in error, out
    assert "HINT" in error and "MONARCH_TLS_CERT" in error and "MONARCH_TLS_CA" in error, out
    assert "could not be reached within" not in error, out
    assert out["seconds"] < 5, out


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_plaintext_client_of_a_tls_proc_is_told_tls_only(certs: dict[str, str]) -> None:
    out = call_across("tcp", NO_TLS, tls_env(certs))
    assert_clear_tls_error(out, "accepts TLS connections only", "TLS is configured on one side only")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_tls_client_of_a_plaintext_proc_says_tls_is_on_its_side_only(certs: dict[str, str]) -> None:
    out = call_across("tls", tls_env(certs), NO_TLS)
    assert_clear_tls_error(
        out, "TLS handshake", "answered in plaintext", "TLS is configured on this side only"
    )


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_client_certificate_refused_by_a_tls13_server_is_a_tls_error(certs: dict[str, str]) -> None:
    # The client trusts the proc's CA, but its own certificate is signed by another one: the
    # proc refuses it after the client finished its side of the TLS 1.3 handshake.
    client = {**tls_env(certs, "rogue"), "MONARCH_TLS_CA": certs["ca"]}
    out = call_across("tls", client, tls_env(certs))
    assert_clear_tls_error(out, "right after the TLS handshake", "refuses this process's certificate")
