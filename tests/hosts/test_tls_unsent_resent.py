"""Read counts and resends over mutual TLS: a TLS connection reset from outside (``ss -K``)
under a burst to a frozen proc loses nothing and runs nothing twice.

The test client's own runtime is on Unix sockets, and a TLS listener takes TLS only: the job
runs in a client process of its own, on TLS, which does what ``test_tcp_unsent_resent`` does
on plain TCP (``burst_cut_by_a_reset``): its messages to the frozen proc, some read, some in
both kernels, some queued, are cut by the reset; the proc says in answer to the replacement's
hello (inside a new TLS session) how many it read, and the client sends the others again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO, TESTS
from tcp_helpers import tls_env

#: A client on TLS: cuts a burst to a frozen proc (``burst_cut_by_a_reset``) with the resend
#: bounds given in argv[2] (JSON), writing the broadcasts run to argv[1]; prints RESULT.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import monarch.actor
    from monarch._src.actor.process_state import runtime
    from monarch._src.runtime.config import configured
    from monarch.actor import enable_transport, this_host

    enable_transport("tls")
    from test_tcp_unsent_resent import burst_cut_by_a_reset

    faults = []
    monarch.actor.unhandled_fault_hook = faults.append
    with configured(**json.loads(sys.argv[2])):
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            address, seen = burst_cut_by_a_reset(pm, Path(sys.argv[1]))
        finally:
            pm.stop().get(timeout=10)
    tls = runtime()._tls is not None
    print("RESULT", json.dumps({"tls": tls, "address": address, "seen": seen, "faults": [f.report() for f in faults]}))
    """
)


def cut_over_tls(certs: dict[str, str], record: Path, settings: dict[str, int]) -> dict:
    env = {
        **os.environ,
        **tls_env(certs),
        "PYTHONPATH": os.pathsep.join([str(TESTS / "hosts"), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(record), json.dumps(settings)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    if "cannot abort TCP connections with ss -K" in done.stderr:
        pytest.skip("cannot abort TCP connections with ss -K here")
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, done.stderr[-3000:]
    return json.loads(results[0][len("RESULT ") :])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_tls_connection_reset_under_a_burst_loses_nothing_and_runs_nothing_twice(
    certs: dict[str, str], tmp_path: Path
) -> None:
    from test_tcp_unsent_resent import BURST

    out = cut_over_tls(certs, tmp_path / "record", {})
    seen = out["seen"]
    gaps = [(a, b) for a, b in zip(seen, seen[1:], strict=False) if b != a + 1]
    assert out["tls"] and out["address"].startswith("tcp:"), out["address"]
    assert seen == list(range(BURST)), (len(seen), len(seen) - len(set(seen)), gaps[:5])
    assert out["faults"] == [], out["faults"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_messages_a_tls_reset_lost_beyond_the_kept_ones_are_reported_with_their_count(
    certs: dict[str, str], tmp_path: Path
) -> None:
    """Nothing kept (``resend_keep_messages=0``): the broadcasts the reset discarded are lost,
    and the recorder's owner (the client) hears how many, exactly, once; the others run once,
    in order."""
    from test_tcp_unsent_resent import BURST

    out = cut_over_tls(certs, tmp_path / "record", {"resend_keep_messages": 0})
    seen = out["seen"]
    gaps = [(a, b) for a, b in zip(seen, seen[1:], strict=False) if b != a + 1]
    assert out["tls"]
    assert seen[0] == 0 and seen[-1] == BURST - 1 and len(gaps) == 1, gaps
    ((last_read, first_resent),) = gaps
    (report,) = out["faults"]
    assert f"recorder[0] never received {first_resent - last_read - 1} messages" in report, report
