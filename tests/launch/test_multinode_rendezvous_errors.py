"""A multi-node launch that cannot form its job says why and exits 1 within its timeout."""

from __future__ import annotations

import pytest
from launch_helpers import Scripts, free_port, monarch_launch

pytestmark = pytest.mark.timeout(60)


def test_too_few_nodes_time_out_with_the_count_and_a_hint(scripts: Scripts) -> None:
    script = scripts.write("ok.py", "print('never runs')\n")
    run = monarch_launch(
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        "--rdzv-id", "lonely", "--rdzv-conf", "join_timeout=1", script,
    )  # fmt: skip
    assert run.rc == 1, run
    assert "rendezvous timed out: 1 of 2 node(s) joined round 0 of job 'lonely'" in run.err, run
    assert "HINT: start the other nodes' launchers" in run.err, run
    assert "never runs" not in run.out
    assert run.seconds < 20, run


def test_a_static_node_without_node_0_says_whom_to_start(scripts: Scripts) -> None:
    script = scripts.write("ok.py", "print('never runs')\n")
    run = monarch_launch(
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "--rdzv-conf", "timeout=1", script,
    )  # fmt: skip
    assert run.rc == 1, run
    assert "cannot connect to the rendezvous store at 127.0.0.1:" in run.err, run
    assert "HINT: start the launcher of node rank 0 (static)" in run.err, run
    assert run.seconds < 20, run
