"""A multi-node launch that cannot form its job says why and exits 1 within its timeout."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest
from helpers import wait_until
from launch_helpers import Scripts, free_port, monarch_launch, start_launcher
from multinode_helpers import listening

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


def test_a_signal_ends_a_launcher_waiting_for_the_other_nodes(scripts: Scripts) -> None:
    script = scripts.write("ok.py", "print('never runs')\n")
    port = free_port()
    proc = start_launcher(
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", "waiting", script,
    )  # fmt: skip
    wait_until(lambda: listening(port), timeout=30, what="the launcher hosting the store")
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 1, err
    assert f"SignalException: Process {proc.pid} got signal: {int(signal.SIGTERM)}" in err, err
    assert time.monotonic() - start < 5, err  # not join_timeout (600 s)


def test_an_endpoint_that_is_not_a_store_is_reported(scripts: Scripts) -> None:
    script = scripts.write("ok.py", "print('never runs')\n")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer_like_a_web_server() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 4)
                conn.recv(1024)

        threading.Thread(target=answer_like_a_web_server, daemon=True).start()
        run = monarch_launch(
            "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", script,
        )  # fmt: skip
    assert run.rc == 1, run
    assert f"127.0.0.1:{port} answered a" in run.err and "is it a TCPStore?" in run.err, run
