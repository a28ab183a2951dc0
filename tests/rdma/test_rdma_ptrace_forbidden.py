"""Where the kernel forbids copying another process's memory (ptrace rules: here a
non-dumpable owner, and a job without CAP_SYS_PTRACE, root's way past that flag), a same-host
transfer falls back to chunks served by the owner's runtime through /dev/shm, says so once,
and moves the same bytes both ways."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from helpers import IMPORT_TEST_MODULES, REPO

pytestmark = pytest.mark.timeout(60)

CLIENT = (
    IMPORT_TEST_MODULES
    + """
import ctypes, sys, warnings
sys.path.insert(0, sys.argv[1])
from rdma_actors import Owner, digest
from monarch.actor import this_host
from monarch.rdma import RDMATcpFallbackWarning


class HiddenOwner(Owner):
    def __init__(self, size):
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: not ptrace-able
        super().__init__(size)


pm = this_host().spawn_procs(per_host={"gpus": 1})
owner = pm.spawn("owner", HiddenOwner, 8 << 20)
buf = owner.get_buffer.call_one().get(timeout=30)
before = owner.digest.call_one().get(timeout=30)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always", RDMATcpFallbackWarning)
    dst = bytearray(buf.size())
    buf.read_into(memoryview(dst)).get(timeout=30)
    patch = bytes(reversed(dst[:4096]))
    buf.write_from(memoryview(patch)).get(timeout=30)
notices = [str(w.message) for w in seen if issubclass(w.category, RDMATcpFallbackWarning)]
print("READ", digest(dst) == before)
print("WRITTEN", digest(patch) == owner.digest.call_one(0, 4096).get())
print("NOTICES", len(notices), "the kernel forbids copying another process's memory" in notices[0])
pm.stop().get(timeout=10)
"""
)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed")
def test_a_forbidden_copy_falls_back_to_served_chunks() -> None:
    # The whole job runs without CAP_SYS_PTRACE: threads of a process keep their own
    # capabilities, so dropping it inside a running worker would not reach its copy threads.
    argv = [
        "setpriv",
        "--bounding-set=-sys_ptrace",
        sys.executable,
        "-c",
        CLIENT,
        str(REPO / "tests" / "rdma"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=50, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "READ True" in done.stdout and "WRITTEN True" in done.stdout, done.stdout + done.stderr
    assert "NOTICES 1 True" in done.stdout, done.stdout + done.stderr
