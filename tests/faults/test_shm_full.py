"""A full /dev/shm never kills a process: large messages then travel through the socket.

Each test runs a whole client (and so its workers) in a private mount namespace whose
``/dev/shm`` is a 64 MiB tmpfs, Docker's default size.
"""

from __future__ import annotations

import subprocess
import textwrap

import pytest
from helpers import run_python_with_private_shm

WARNING = "large messages of this process go through the socket instead"


def _run_with_small_shm(code: str) -> subprocess.CompletedProcess[str]:
    # MONARCH_STDERR_LOG: the framework's warnings go to stderr too, where the test sees them.
    return run_python_with_private_shm(textwrap.dedent(code), shm_size="64m", MONARCH_STDERR_LOG="WARN")


@pytest.mark.timeout(120)
def test_100_mib_argument_and_return_with_64_mib_shm():
    proc = _run_with_small_shm(
        """
        import os, numpy as np
        from monarch.actor import Actor, endpoint, this_host

        class Echo(Actor):
            @endpoint
            def total(self, x):
                return float(x.sum())

            @endpoint
            def make(self, n):
                return np.ones(n, dtype=np.uint8)

            @endpoint
            def pid(self):
                return os.getpid()

        n = 100 << 20
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        echo = pm.spawn("echo", Echo)
        print("PID", echo.pid.call_one().get(timeout=30), flush=True)
        print("ARG", echo.total.call_one(np.ones(n, dtype=np.uint8)).get(timeout=60), flush=True)
        print("RET", int(echo.make.call_one(n).get(timeout=60).sum()), flush=True)
        print("AGAIN", echo.total.call_one(np.ones(n, dtype=np.uint8)).get(timeout=60), flush=True)
        pm.stop().get(timeout=10)
        """
    )
    out = proc.stdout
    assert proc.returncode == 0, f"rc={proc.returncode}\n{out}\n{proc.stderr}"
    n = 100 << 20
    assert f"ARG {float(n)}" in out and f"RET {n}" in out and f"AGAIN {float(n)}" in out, out
    # One warning per process that fell back: the client (argument) and the worker (return).
    assert 1 <= proc.stderr.count(WARNING) <= 2, proc.stderr


@pytest.mark.timeout(60)
def test_receiving_a_sparse_file_on_a_full_shm_does_not_sigbus():
    """A peer that did not reserve its file's pages (a sparse file) on a full tmpfs: mapping it
    and touching its pages would need pages the tmpfs cannot give (SIGBUS)."""
    proc = _run_with_small_shm(
        """
        import os
        from monarch._src.runtime import shm

        size = 32 << 20
        with open("/dev/shm/filler", "wb") as f:  # fill the tmpfs to the last page
            try:
                while True:
                    f.write(b"x" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        given_back = []
        for name, receive in [
            ("monarch-job-sparse-1", lambda name: shm.import_(name)),
            ("monarch-job-sparse-2", lambda name: shm.borrow(name, size, False, lambda: given_back.append(1))),
        ]:
            fd = os.open("/dev/shm/" + name, os.O_CREAT | os.O_RDWR, 0o600)
            os.ftruncate(fd, size)  # sparse: no page reserved
            os.close(fd)
            data = receive(name.encode())
            print(name, sum(data[::4096]), len(data), flush=True)
        print("GIVEN_BACK", len(given_back))
        """
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert f"monarch-job-sparse-1 0 {32 << 20}" in proc.stdout, proc.stdout
    assert f"monarch-job-sparse-2 0 {32 << 20}" in proc.stdout, proc.stdout
    assert "GIVEN_BACK 1" in proc.stdout, proc.stdout
