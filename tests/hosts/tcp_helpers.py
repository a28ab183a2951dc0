"""Helpers of the TCP tests: procs listening on TCP for this test client, and TLS files."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import hmac
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import netns
import pytest
from helpers import REPO, TESTS

from monarch._src.actor.process_state import runtime
from monarch._src.runtime.config import configured
from monarch._src.transport.address import TcpAddress, parse
from monarch.actor import Actor, endpoint, this_host

#: The server's challenge: magic, version, nonce.
CHALLENGE_BYTES = 4 + 1 + 32


class Where(Actor):
    """Tells where its process is and echoes what it is sent."""

    @endpoint
    async def where(self) -> tuple[int, str]:
        return os.getpid(), runtime().address

    @endpoint
    async def echo(self, x: Any) -> Any:
        return x


@contextlib.contextmanager
def tcp_procs(n: int = 1, bind_host: str = "127.0.0.1", env: dict[str, str] | None = None) -> Iterator[Any]:
    """A proc mesh of ``n`` procs listening on TCP at ``bind_host``, spawned by this test
    process (whose own runtime, shared by the session, stays on Unix sockets: a mixed job, as
    when a client talks to procs of other hosts). Stopped after."""
    rt = runtime()
    before = rt.transport
    rt.transport = "tcp"  # what the spawner binds for the new procs
    try:
        with configured(tcp_bind_host=bind_host):
            pm = this_host().spawn_procs(per_host={"gpus": n}, env=env)
    finally:
        rt.transport = before
    try:
        yield pm
    finally:
        pm.stop().get(timeout=10)


def make_certs(folder: Path) -> dict[str, str]:
    """A CA with a certificate for the job ("node"), and a rogue CA with its own ("rogue"):
    ``{"ca", "node.pem", "node.key", "rogue.pem", "rogue.key"}`` paths. Skips without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command, which makes the test certificates, is missing")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=30)

    for ca in ("ca", "rogueca"):
        openssl(
            "req",
            "-x509",
            *ec,
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.pem",
            "-days",
            "1",
            "-subj",
            f"/CN={ca}",
        )
    for leaf, ca in (("node", "ca"), ("rogue", "rogueca")):
        openssl("req", *ec, "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr", "-subj", f"/CN={leaf}")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{leaf}.csr",
            "-CA",
            f"{ca}.pem",
            "-CAkey",
            f"{ca}.key",
            "-set_serial",
            "1",
            "-out",
            f"{leaf}.pem",
            "-days",
            "1",
        )
    names = ["node.pem", "node.key", "rogue.pem", "rogue.key"]
    return {"ca": str(folder / "ca.pem"), **{n: str(folder / n) for n in names}}


def tls_env(certs: dict[str, str], who: str = "node") -> dict[str, str]:
    """The environment that gives a process ``who``'s certificate (of ``make_certs``)."""
    return {
        "MONARCH_TLS_CERT": certs[f"{who}.pem"],
        "MONARCH_TLS_KEY": certs[f"{who}.key"],
        "MONARCH_TLS_CA": certs["ca"],
    }


def worker_log(pid: int) -> str:
    """The framework log of worker ``pid`` of this test client's job ("" before its first record)."""
    from monarch._src.runtime import framework_log

    files = glob.glob(os.path.join(framework_log.log_dir(), f"*-{pid}.log"))
    return Path(files[0]).read_text() if files else ""


def tcp_connect(address: str, timeout: float = 10.0) -> socket.socket:
    """A plain TCP connection to the proc at ``address`` (a ``tcp:`` address)."""
    parsed = parse(address)
    assert isinstance(parsed, TcpAddress), address
    return socket.create_connection((parsed.host, parsed.port), timeout=timeout)


def handshake(sock: socket.socket, secret: bytes) -> bytes:
    """Answer the server's challenge with ``secret``; return what the server answers (its
    32-byte proof when the secret is right, b"" when it hangs up)."""
    challenge = recv_exactly(sock, CHALLENGE_BYTES)
    assert challenge.startswith(b"MNRC"), challenge
    nonce_s, nonce_c = challenge[5:], os.urandom(32)
    sock.sendall(nonce_c + hmac.digest(secret, b"C" + nonce_s + nonce_c, hashlib.sha256))
    return recv_exactly(sock, 32)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes, or fewer if the peer hangs up first."""
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def frame_head(header: dict[str, Any]) -> bytes:
    """Prefix and header of a frame (its bodies, of the lengths in header["b"], follow)."""
    head = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<I", len(head)) + head


class ClusterAgents:
    """A host agent on each host of a cluster, on its own address and port ``AGENT_PORT``."""

    AGENT_PORT = 4100

    def __init__(self, cluster: netns.Cluster, secret_file: str) -> None:
        self.secret = secret_file
        self.addresses: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []
        for i, host in enumerate(cluster.hosts):
            address = f"tcp:{host.address}:{self.AGENT_PORT}"
            agent = cluster.popen(
                i,
                [sys.executable, "-m", "monarch.host", "--listen", address, "--secret-file", secret_file],
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(TESTS)},
            )
            self.procs.append(agent)
            first = agent.stderr.readline()  # type: ignore[union-attr]
            assert f"listening on {address}" in first, first
            self.addresses.append(address)
