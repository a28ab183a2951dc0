"""Worker output: captured by the spawner, shown on the client, streamed and aggregated on request.

Each test runs a small client script in its own interpreter and checks what reached that
client's stdout and stderr, so what is asserted is what a user sees on a terminal.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

PRELUDE = """\
import asyncio, logging, os, sys, time
from monarch.actor import Actor, endpoint, this_host, context
from monarch._src.host.spawner import flush_worker_output


class Talker(Actor):
    @endpoint
    def say(self, n: int, text: str, err: bool = False) -> None:
        for _ in range(n):
            print(text, file=sys.stderr if err else sys.stdout)

    @endpoint
    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    @endpoint
    def log(self, level: int, msg: str) -> None:
        logging.getLogger("user.code").log(level, msg)


def option(mesh, **kw):
    asyncio.run(mesh.logging_option(**kw))
"""


def run_client(
    tmp_path: Path, body: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "client.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    full_env = {**os.environ, "MONARCH_LOG_DIR": str(tmp_path / "logs"), **(env or {})}
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=tmp_path,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "\x1e" not in proc.stdout + proc.stderr, "a control line leaked"
    return proc


def test_default_output_reaches_the_client_unprefixed(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        t = procs.spawn("t", Talker)
        t.say.call(2, "plain out").get()
        t.say.call(1, "plain err", True).get()
        flush_worker_output()
        print("CLIENT END")
    """,
        )
    )
    out_lines = proc.stdout.splitlines()
    assert out_lines.count("plain out") == 4
    assert out_lines.index("CLIENT END") == 4  # the barrier made them visible first
    assert proc.stderr.splitlines().count("plain err") == 2
    assert "plain err" not in proc.stdout and "plain out" not in proc.stderr


def test_similar_lines_are_aggregated_within_the_window(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        t = procs.spawn("t", Talker)
        import io

        class Tee(io.TextIOBase):  # remembers what this client wrote to its stdout
            def __init__(self, real):
                self.real, self.seen = real, []

            def write(self, s):
                self.seen.append(s)
                return self.real.write(s)

            def flush(self):
                self.real.flush()

        sys.stdout = tee = Tee(sys.stdout)
        option(procs, stream_to_client=True, aggregate_window_sec=1)
        start = time.monotonic()
        t.say.call(5, "aggregated log line").get()
        t.say.call(3, "an error line", True).get()
        while not any("similar" in s for s in tee.seen):  # the window closes by itself
            assert time.monotonic() - start < 20
            time.sleep(0.01)
        print(f"WINDOW CLOSED after {time.monotonic() - start:.2f} s", file=sys.stderr)
    """,
        )
    )
    out = proc.stdout.splitlines()
    assert out == ["[10 similar log lines] aggregated log line"]
    assert proc.stderr.splitlines().count("[6 similar log lines] an error line") == 1
    took = float(proc.stderr.split("WINDOW CLOSED after ")[1].split()[0])
    assert 0.9 <= took < 10


def test_numbers_do_not_make_lines_different(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        class Stepper(Actor):
            @endpoint
            def steps(self) -> None:
                for i in range(4):
                    print(f"step {i} loss={1.0 / (i + 1):.3f}")
                print("done")

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        s = procs.spawn("s", Stepper)
        option(procs, stream_to_client=True, aggregate_window_sec=30)
        s.steps.call().get()
        flush_worker_output()
        print("CLIENT END")
    """,
        )
    )
    assert proc.stdout.splitlines() == ["[4 similar log lines] step 0 loss=1.000", "done", "CLIENT END"]


def test_window_none_flushes_then_lines_come_as_they_are(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        t = procs.spawn("t", Talker)
        option(procs, stream_to_client=True, aggregate_window_sec=60)
        t.say.call(5, "aggregated log line").get()
        option(procs, stream_to_client=True, aggregate_window_sec=None)
        t.say.call(2, "later line").get()
        flush_worker_output()
        print("CLIENT END")
    """,
        )
    )
    out = proc.stdout.splitlines()
    assert out == ["[10 similar log lines] aggregated log line"] + ["later line"] * 4 + ["CLIENT END"]


def test_stream_off_goes_back_to_direct_output(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        t = procs.spawn("t", Talker)
        option(procs, stream_to_client=True, aggregate_window_sec=60)
        t.say.call(2, "streamed").get()
        option(procs, stream_to_client=False, aggregate_window_sec=1)
        t.say.call(5, "direct again").get()
        flush_worker_output()
        print("CLIENT END")
    """,
        )
    )
    out = proc.stdout.splitlines()
    # turning streaming off wrote what the window held; later lines are not aggregated
    assert out[0] == "[4 similar log lines] streamed"
    assert out[1:] == ["direct again"] * 10 + ["CLIENT END"]


def test_level_filters_python_logging_but_not_print(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        t = procs.spawn("t", Talker)
        option(procs, stream_to_client=True, aggregate_window_sec=None, level=logging.FATAL)
        t.log.call(logging.ERROR, "filtered error").get()
        t.say.call(1, "printed regardless").get()
        option(procs, stream_to_client=True, aggregate_window_sec=None, level=logging.ERROR)
        t.log.call(logging.ERROR, "forwarded error").get()
        t.log.call(logging.WARNING, "filtered warning").get()
        flush_worker_output()
    """,
        )
    )
    assert proc.stdout.splitlines().count("printed regardless") == 2
    assert "filtered" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.endswith("forwarded error")]
    assert len(errors) == 2
    assert all(line.startswith("[actor=") and "Talker t" in line for line in errors)


def test_prefix_with_rank(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        procs = this_host().spawn_procs(per_host={"hosts": 1, "gpus": 2})
        t = procs.spawn("t", Talker)
        option(procs, stream_to_client=True, aggregate_window_sec=None, prefix_with_rank=True)
        t.slice(gpus=1).say.call(1, "from one").get()
        flush_worker_output()
    """,
        )
    )
    assert proc.stdout.splitlines() == ["[hosts=0,gpus=1] from one"]


def test_python_logging_in_actors_names_the_actor_and_can_be_switched_off(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        import importlib
        import monarch.actor
        cfg = getattr(monarch.actor, "config", None) or importlib.import_module("monarch._src.actor.config")
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)

        class Logs(Actor):
            @endpoint
            def go(self, msg: str) -> None:
                logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
                logging.getLogger("x").info(msg)
                logging.getLogger("x").info("")
                logging.getLogger("x").info("%d%% done", 50)

        here = this_proc_actor = monarch.actor.this_proc().spawn("here", Logs)
        here.go.call_one("in the client").get()
        logging.getLogger("x").info("outside any actor")
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        procs.spawn("remote", Logs).go.call_one("in a worker").get()
        cfg.prefix_python_logs_with_actor = False
        here.go.call_one("unprefixed").get()
        procs2 = this_host().spawn_procs(per_host={"gpus": 1})  # spawned with the switch off
        procs2.spawn("remote2", Logs).go.call_one("unprefixed worker").get()
        flush_worker_output()
    """,
        )
    )
    out = proc.stdout.splitlines()
    assert any(
        line.startswith("[actor=<root>.<__main__.Logs here") and line.endswith("] in the client")
        for line in out
    )
    assert any(
        line.startswith("[actor=<root>.<__main__.Logs remote") and line.endswith("] in a worker")
        for line in out
    )
    assert any(line.startswith("[actor=") and line.endswith("] 50% done") for line in out)
    assert "outside any actor" in out and "unprefixed" in out and "unprefixed worker" in out
    assert "" in out  # an empty message stays empty


def test_partial_lines_and_control_lines_in_the_same_stream(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        t = procs.spawn("t", Talker)
        t.write.call("abc").get()
        option(procs, stream_to_client=True, aggregate_window_sec=None)
        t.write.call("def\\n").get()
        t.write.call("tail without newline").get()
        procs.stop().get()
        print("CLIENT END")
    """,
        )
    )
    assert "abcdef" in proc.stdout
    assert proc.stdout.index("tail without newline") < proc.stdout.index("CLIENT END")


def test_output_of_a_crashing_worker_comes_before_the_failure_report(tmp_path: Path) -> None:
    proc = run_client(
        tmp_path,
        """
        class Crash(Actor):
            @endpoint
            def die(self) -> None:
                print("last words", file=sys.stderr, flush=True)
                os._exit(3)

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        procs.spawn("c", Crash).die.broadcast()
        time.sleep(30)  # ended by the unhandled failure
    """,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Unhandled monarch error" in proc.stderr
    assert proc.stderr.index("last words") < proc.stderr.index("Unhandled monarch error")


def test_framework_logs_go_to_a_file_per_process_not_the_terminal(tmp_path: Path) -> None:
    body = """
        class Fw(Actor):
            @endpoint
            def go(self) -> None:
                logging.getLogger("monarch.test").info("framework record in worker")
                logging.getLogger("monarch.test").log(5, "trace record in worker")

        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)  # must not show monarch's
        procs = this_host().spawn_procs(per_host={"gpus": 1}, name="fwmesh")
        procs.spawn("fw", Fw).go.call_one().get()
        logging.getLogger("monarch.test").info("framework record in client")
        print("PID", os.getpid())
    """
    proc = ok(run_client(tmp_path, body))
    assert "framework record" not in proc.stdout + proc.stderr
    pid = proc.stdout.split("PID ")[1].split()[0]
    logs = tmp_path / "logs"
    client_log = (logs / f"client-{pid}.log").read_text()
    assert "framework record in client" in client_log
    worker_logs = list(logs.glob("fwmesh-rank0-*.log"))
    assert len(worker_logs) == 1
    text = worker_logs[0].read_text()
    assert "framework record in worker" in text and "trace record" not in text

    proc = ok(run_client(tmp_path, body, env={"MONARCH_STDERR_LOG": "INFO", "MONARCH_FILE_LOG": "TRACE"}))
    assert "framework record in client" in proc.stderr and "framework record in worker" in proc.stderr
    assert "trace record in worker" not in proc.stderr
    assert any("trace record in worker" in p.read_text() for p in logs.glob("fwmesh-rank0-*.log"))

    proc = ok(run_client(tmp_path, body, env={"MONARCH_FILE_LOG": "LOUD"}))
    warnings = [line for line in proc.stderr.splitlines() if "MONARCH_FILE_LOG" in line]
    assert len(warnings) == 1, proc.stderr  # from the client only, not once per worker
    assert "'LOUD'" in warnings[0] and "TRACE, DEBUG, INFO, WARN, ERROR" in warnings[0]


@pytest.mark.slow
def test_a_client_that_never_reads_its_stdout_does_not_stall_workers(tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(
        PRELUDE
        + textwrap.dedent("""
        class Flood(Actor):
            @endpoint
            def flood(self, n: int) -> float:
                start = time.monotonic()
                line = "x" * 70
                for i in range(n):
                    print(line, i)
                return time.monotonic() - start

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        took = procs.spawn("f", Flood).flood.call_one(300_000).get()
        print(f"FLOODED in {took:.2f}s", file=sys.stderr, flush=True)
    """)
    )
    env = {**os.environ, "MONARCH_LOG_DIR": str(tmp_path / "logs")}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path
    )
    try:
        # Nobody reads the client's stdout until the worker finished writing ~23 MB to it.
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)  # type: ignore[arg-type]
        err = b""
        deadline = time.monotonic() + 60
        while b"FLOODED" not in err:
            assert time.monotonic() < deadline, f"the worker stalled; stderr so far: {err!r}"
            if sel.select(timeout=0.5):
                chunk = os.read(proc.stderr.fileno(), 65536)  # type: ignore[union-attr]
                assert chunk, f"client ended early: {err!r}"
                err += chunk
        out, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (err + rest).decode()
    text = out.decode()
    notices = [line for line in text.splitlines() if line.startswith("[monarch: ")]
    assert notices and all(
        line.endswith(" lines from anon0 rank 0 dropped]") or "dropped]" in line for line in notices
    )
    dropped = sum(int(line.split()[1]) for line in notices)
    shown = sum(1 for line in text.splitlines() if line.startswith("x" * 70))
    assert dropped > 0 and shown + dropped == 300_000


def test_logging_option_rejects_bad_arguments(tmp_path: Path) -> None:
    proc = ok(
        run_client(
            tmp_path,
            """
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        for kw in ({"level": 256}, {"level": -1}, {"aggregate_window_sec": -1}, {"aggregate_window_sec": "3"}):
            try:
                option(procs, stream_to_client=True, **kw)
            except ValueError as e:
                print("ValueError:", e)
    """,
        )
    )
    out = proc.stdout.splitlines()
    assert out[:2] == ["ValueError: Invalid logging level: 256", "ValueError: Invalid logging level: -1"]
    assert len(out) == 4 and all(
        line.startswith("ValueError: Invalid aggregate_window_sec") for line in out[2:]
    )


def test_notebook_cell_output_is_flushed_before_the_cell_returns(tmp_path: Path) -> None:
    pytest.importorskip("IPython")
    proc = ok(
        run_client(
            tmp_path,
            """
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        cells = [
            "procs = this_host().spawn_procs(per_host={'gpus': 2})\\n"
            "t = procs.spawn('t', Talker)\\n"
            "r = t.say.call(3, 'direct from a worker').get()\\n",
            "option(procs, stream_to_client=True, aggregate_window_sec=60)\\n"
            "t.say.call(5, 'aggregated in a cell').get()\\n"
            "r = t.say.call(1, 'stderr in a cell', True).get()\\n",
        ]
        shell.user_ns.update(globals())
        for i, cell in enumerate(cells):
            result = shell.run_cell(cell)
            assert result.success, result.error_in_exec
            print(f"CELL {i} RETURNED", flush=True)
            print(f"CELL {i} RETURNED", file=sys.stderr, flush=True)
    """,
        )
    )
    out = proc.stdout.splitlines()
    assert out.index("CELL 0 RETURNED") == 6 and out.count("direct from a worker") == 6, out
    assert out.index("[10 similar log lines] aggregated in a cell") < out.index("CELL 1 RETURNED")
    err = proc.stderr.splitlines()
    assert err.index("[2 similar log lines] stderr in a cell") < err.index("CELL 1 RETURNED")
