"""The host agent's command line and who it lets in: ``python -m monarch.host``,
``run_worker_loop_forever`` / ``attach_to_workers`` with Monarch's signatures, a client with
a wrong secret refused, an unreachable agent named in the error."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import psutil
import pytest
from actors import Pid
from helpers import REPO, TESTS, wait_gone, wait_until

import monarch.actor
from monarch._src.transport import auth
from monarch._src.wire import protocol
from monarch._src.wire.frame import encode_frame
from monarch.actor import Channel, MeshFailure, attach_to_workers, hosts_from_config
from monarch.config import configured

pytestmark = pytest.mark.timeout(60)


def _without_secrets() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_HOST_SECRET")}


def _agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch.host", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env=_without_secrets(),
    )


def test_help_documents_the_listen_address_and_where_the_secret_comes_from() -> None:
    out = _agent("--help").stdout
    for text in ("--listen", "--secret-file", "MONARCH_HOST_SECRET", "never from", "--once"):
        assert text in out, out


def test_no_secret_or_an_open_secret_file_is_refused(tmp_path: Path) -> None:
    no_secret = _agent("--listen", f"unix:{tmp_path}/a.sock")
    assert no_secret.returncode == 2 and "no secret given" in no_secret.stderr and "HINT" in no_secret.stderr
    secret = tmp_path / "secret"
    secret.write_text("abc")
    secret.chmod(0o644)
    readable = _agent("--listen", f"unix:{tmp_path}/a.sock", "--secret-file", str(secret))
    assert readable.returncode == 2 and f"HINT: chmod 600 {secret}" in readable.stderr
    neither = _agent("--secret-file", str(secret))
    assert neither.returncode == 2 and "--listen" in neither.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
def test_a_secret_file_of_another_user_is_refused(tmp_path: Path) -> None:
    # Its owner could have chosen the secret: whoever knows it runs code as this user.
    secret = tmp_path / "secret"
    secret.write_text("chosen-by-someone-else")
    secret.chmod(0o600)
    os.chown(secret, 65534, 65534)  # nobody
    planted = _agent("--listen", f"unix:{tmp_path}/a.sock", "--secret-file", str(secret))
    assert planted.returncode == 2, planted.stderr
    assert "belongs to uid 65534, not to this user" in planted.stderr and "HINT" in planted.stderr
    assert not (tmp_path / "a.sock").exists()


def test_a_client_with_a_wrong_secret_is_refused(monkeypatch: pytest.MonkeyPatch, agent: Any) -> None:
    faults: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", faults.append)
    monkeypatch.setenv("MONARCH_TEST_HOSTS", agent.address)
    monkeypatch.setenv("MONARCH_HOST_SECRET", "not-the-agents-secret")
    monkeypatch.delenv("MONARCH_HOST_SECRET_FILE", raising=False)
    with configured(host_attach_timeout_s=1):
        hosts = hosts_from_config("MONARCH_TEST_HOSTS")
        with pytest.raises(RuntimeError) as info:
            hosts.initialized.get(timeout=10)
        with pytest.raises(RuntimeError, match="attach failed"):
            hosts.spawn_procs()
    message = str(info.value)
    assert "attach failed: config push failed during attach" in message and agent.address in message
    assert "HINT" in message and "MONARCH_HOST_SECRET" in message
    # The right secret still gets in; the refused client never got a session.
    monkeypatch.setenv("MONARCH_HOST_SECRET_FILE", agent.secret_file)
    good = hosts_from_config("MONARCH_TEST_HOSTS")
    pid = good.spawn_procs().spawn("pid", Pid).pid.call_one().get(timeout=20)
    session = psutil.Process(pid).ppid()
    log = agent.stderr_after_exit()  # SIGTERM: the agent ends its sessions and exits
    assert agent.proc.returncode == 0 and wait_gone([pid, session]) == []
    assert "client failed authentication" in log and log.count("session for client") == 1, log
    assert len(faults) == 1 and "lost with its host" in faults[0].report()
    with pytest.raises(
        RuntimeError, match=f"cannot spawn procs on the host of agent {agent.address}: the host was lost"
    ):
        good.spawn_procs()


def test_attach_to_an_unreachable_agent_returns_at_once_and_fails_naming_it(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/nobody.sock"
    hosts = attach_to_workers(ca="trust_all_connections", workers=[address], name="nobody")
    assert dict(hosts.extent) == {"hosts": 1}
    with pytest.raises(RuntimeError, match=f"attach failed.*unix:{tmp_path}/nobody.sock"):
        hosts.initialized.get(timeout=10)


def test_run_worker_loop_forever_and_attach_to_workers(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from monarch.actor import run_worker_loop_forever\n"
            f"run_worker_loop_forever(ca='trust_all_connections', address='ipc://{tmp_path}/w.sock')",
        ],
        cwd=REPO,
        env=_without_secrets() | {"PYTHONPATH": str(TESTS)},
    )
    try:
        wait_until(
            lambda: (tmp_path / "w.sock").exists() or server.poll() is not None, what="the worker loop"
        )
        hosts = attach_to_workers(ca="trust_all_connections", workers=[f"ipc://{tmp_path}/w.sock"] * 2)
        assert dict(hosts.extent) == {"hosts": 2}
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        assert len(set(procs.spawn("pid", Pid).pid.call().get(timeout=20).values())) == 2
        hosts.shutdown().get(timeout=30)
    finally:
        server.terminate()
        server.wait(10)
    assert server.returncode == 0


def test_tls_takes_both_files_before_the_runtime_starts() -> None:
    with pytest.raises(ValueError, match="mutual TLS takes both ca"):
        attach_to_workers(private_key="/etc/key.pem", ca="trust_all_connections", workers=["unix:/x.sock"])
    with pytest.raises(ValueError, match="mutual TLS takes both ca"):
        attach_to_workers(ca="/etc/ca.pem", workers=["unix:/x.sock"])
    Channel.open()  # this process's runtime is running (without TLS)
    with pytest.raises(RuntimeError, match="TLS must be set up before this process's monarch runtime starts"):
        attach_to_workers(ca="/etc/ca.pem", private_key="/etc/key.pem", workers=["unix:/x.sock"])


def test_trust_all_to_a_non_loopback_address_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MONARCH_HOST_SECRET", raising=False)
    monkeypatch.delenv("MONARCH_HOST_SECRET_FILE", raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):  # 0.0.0.0 is no loopback address, and nothing listens there
            hosts = attach_to_workers(ca="trust_all_connections", workers=["tcp://0.0.0.0:9"])
            with pytest.raises(RuntimeError, match="attach failed.*0.0.0.0:9"):
                hosts.initialized.get(timeout=15)
    exposed = [w for w in seen if "any client that can reach" in str(w.message)]
    assert len(exposed) == 1, [str(w.message) for w in seen]


def _authenticated_socket(path: str, secret: bytes) -> socket.socket:
    """A connection to the agent at ``path`` that passed the handshake with ``secret``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    nonce_s = auth.parse_challenge(sock.recv(auth.CHALLENGE_BYTES, socket.MSG_WAITALL))
    nonce_c = auth.new_nonce()
    sock.sendall(auth.client_proof(secret, nonce_s, nonce_c))
    auth.check_server_proof(secret, nonce_c, nonce_s, sock.recv(auth.SERVER_PROOF_BYTES, socket.MSG_WAITALL))
    return sock


@pytest.mark.parametrize(
    "header, bodies, logged",
    [
        ({protocol.KIND: protocol.HOST_HELLO_KIND}, [b"x"], "malformed hello"),  # no nonce, root, port
        (protocol.host_hello(["a", 1], "root", b"n"), [], "unexpected frame"),  # no sealed secret
        (protocol.message("actor", "endpoint", None, 0, [[], []]), [], "unexpected frame kind 1"),
    ],
)
def test_a_malformed_hello_closes_only_that_connection(
    agent: Any, monkeypatch: pytest.MonkeyPatch, header: dict, bodies: list, logged: str
) -> None:
    secret = Path(agent.secret_file).read_bytes().strip()
    sock = _authenticated_socket(agent.address[len("unix:") :], secret)
    with sock:
        sock.sendall(b"".join(bytes(b) for b in encode_frame(header, bodies, 1 << 20)))
        try:
            assert sock.recv(1) == b""  # the agent closed this connection...
        except ConnectionResetError:
            pass  # ... or reset it
    monkeypatch.setenv("MONARCH_TEST_HOSTS", agent.address)
    monkeypatch.setenv("MONARCH_HOST_SECRET_FILE", agent.secret_file)
    hosts = hosts_from_config("MONARCH_TEST_HOSTS")
    assert hosts.initialized.get(timeout=20) is True  # and still serves a good client
    hosts.shutdown().get(timeout=30)
    log = agent.stderr_after_exit()
    assert logged in log and log.count("session for client") == 1, log
