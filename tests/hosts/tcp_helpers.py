"""Helpers of the TCP tests: procs listening on TCP for this test client, and TLS files."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch._src.actor.proc import runtime
from monarch._src.runtime.config import configured
from monarch.actor import Actor, endpoint, this_host


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
