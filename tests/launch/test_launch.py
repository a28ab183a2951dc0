"""``python -m monarch.launch`` end to end: real launcher, real worker processes.

These scripts do not import torch, so each launch takes about a second. What torch
itself brings (``@record``, ``init_process_group``, DDP) is in ``test_conformance.py``.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from launch_helpers import (
    alive,
    clean_env,
    monarch_launch,
    start_launcher,
    wait_until,
    workers_of,
)

ENV_DUMP = """
import json, os, sys
out = os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json")
with open(out, "w") as fp:
    json.dump({
        "env": dict(os.environ),
        "argv": sys.argv,
        "path0": sys.path[0],
        "name": __name__,
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "torch": "torch" in sys.modules,
    }, fp)
print("rank", os.environ["RANK"], "done")
"""

FAIL_RANK1 = """
import os, signal, sys, time
rank, world, sync = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1]
if rank == 1:
    # Fail once every other rank is ready for SIGTERM (file-based barrier).
    while len(os.listdir(sync)) < world - 1:
        time.sleep(0.01)
    print("rank1 exiting with 3", flush=True)
    sys.exit(3)
def on_term(signum, frame):
    print(f"rank{rank} got SIGTERM", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(sync, str(rank)), "w").close()
time.sleep(60)
"""


def _dumps(directory: Path, n: int) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(n)]


# -- worker environment and entry points -------------------------------------------------------------


#: Workers started by fork+exec each, and forked from a template that preloaded a module.
STARTS = pytest.mark.parametrize("start", [[], ["--preload", "json"]], ids=["exec", "preload"])


@pytest.mark.timeout(60)
@STARTS
def test_workers_get_torchrun_env_and_run_script_as_main(scripts, tmp_path, start):
    script = scripts.write("envdump.py", ENV_DUMP)
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env(SENTINEL_VAR="kept")
    r = monarch_launch("--nproc-per-node", "3", *start, script, str(out), env=env, cwd=tmp_path)
    assert r.rc == 0, r
    dumps = _dumps(out, 3)
    for rank, d in enumerate(dumps):
        e = d["env"]
        assert e["RANK"] == e["LOCAL_RANK"] == e["ROLE_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == "3"
        assert e["GROUP_RANK"] == "0" and e["GROUP_WORLD_SIZE"] == "1"
        assert e["ROLE_NAME"] == "default"
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert e["OMP_NUM_THREADS"] == "1"
        assert e["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
        assert e["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{rank}/error.json")
        assert e["SENTINEL_VAR"] == "kept"
        # Nothing of monarch's own plumbing leaks into the user's environment.
        assert not [k for k in e if k.startswith("MONARCH_") and k != "MONARCH_TEST_SESSION"]
        assert d["argv"] == [script, str(out)]
        assert d["path0"] == str(Path(script).parent)
        assert d["name"] == "__main__"
        assert d["cwd"] == str(tmp_path)
        assert d["torch"] is False
        assert d["pgid"] == d["pid"]  # each worker leads its own process group, like torchrun's
    # One rendezvous for all: same port, a uuid run id (torchrun's implicit standalone).
    assert len({d["env"]["MASTER_PORT"] for d in dumps}) == 1
    assert re.fullmatch(r"[0-9a-f-]{36}", dumps[0]["env"]["TORCHELASTIC_RUN_ID"])
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in r.err
    assert sorted(re.findall(r"rank (\d) done", r.out)) == ["0", "1", "2"]


@pytest.mark.timeout(60)
def test_launcher_does_not_import_torch(scripts, tmp_path):
    script = scripts.write("p.py", "print('hi')\n")
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "monarch.launch", script],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    imported = re.findall(r"\|\s+(\S+)\s*$", r.stderr, re.MULTILINE)
    assert "monarch.launch" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_module_run_path_and_no_python(scripts, tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(
        "import os, sys\nprint('module', __name__, os.environ['RANK'], sys.argv[1:])\n"
    )
    r = monarch_launch("--nproc-per-node", "2", "-m", "pkg.mod", "a", "b", cwd=tmp_path)
    assert r.rc == 0, r
    assert sorted(r.out.split("\n")[:2]) == ["module __main__ 0 ['a', 'b']", "module __main__ 1 ['a', 'b']"]

    script = scripts.write(
        "runpath.py", "import os\nif os.environ['RANK'] == '1':\n    raise KeyError('rp')\n"
    )
    r = monarch_launch("--nproc-per-node", "2", "--run-path", script)
    assert r.rc == 1, r
    assert "run_script_path FAILED" in r.err
    assert "KeyError: 'rp'" in r.err  # the error file written for --run-path, as torchrun does
    assert "Failures:\n  <NO_OTHER_FAILURES>" in r.err  # --run-path lists the first failure only

    sync = tmp_path / "sync"
    sync.mkdir()
    shell = (
        f'echo "sh rank $RANK"; if [ "$RANK" = 0 ]; then touch {sync}/r0; exit 0; fi; '
        f"while [ ! -e {sync}/r0 ]; do sleep 0.01; done; exit 5"
    )
    r = monarch_launch("--nproc-per-node", "2", "--no-python", "sh", "-c", shell)
    assert r.rc == 1, r
    assert sorted(re.findall(r"sh rank (\d)", r.out)) == ["0", "1"]
    assert re.search(r"rank      : 1 \(local_rank: 1\)\n  exitcode  : 5 \(pid: \d+\) \n", r.err)
    assert "sh FAILED" in r.err


# -- failures ------------------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@STARTS
def test_one_rank_failing_stops_the_others_with_torchrun_summary(scripts, tmp_path, start):
    script = scripts.write("fail.py", FAIL_RANK1)
    sync = tmp_path / "sync"
    sync.mkdir()
    r = monarch_launch("--nproc-per-node", "3", "--summary", *start, script, str(sync))
    assert r.rc == 1, r
    assert "rank0 got SIGTERM" in r.out and "rank2 got SIGTERM" in r.out
    assert len(re.findall(r"Sending process \d+ closing signal SIGTERM", r.err)) == 2
    assert re.search(r"failed \(exitcode: 3\) local_rank: 1 \(pid: \d+\) of binary: ", r.err)
    summary = r.err[r.err.index("=" * 60) :]
    title = f"{script} FAILED"
    assert summary.startswith("=" * 60 + "\n" + title + "\n" + "-" * 60 + "\nFailures:\n[1]:\n")
    blocks = re.findall(
        r"\[(\d)\]:\n  time      : \d{4}-\d\d-\d\d_\d\d:\d\d:\d\d\n  host      : .+\n"
        r"  rank      : (\d) \(local_rank: (\d)\)\n  exitcode  : (-?\d+) \(pid: \d+\) (.*)\n"
        r"  error_file: (.+)\n  traceback : (.+)\n",
        summary,
    )
    assert [(b[0], b[1], b[3]) for b in blocks] == [("1", "0", "143"), ("2", "2", "143"), ("0", "1", "3")]
    assert "Root Cause (first observed failure):\n[0]:" in summary
    assert all(b[5] == "<N/A>" for b in blocks)
    assert summary.rstrip().endswith("=" * 60)
    # --summary: one row per rank with its exit code, wall time and peak RSS.
    rows = re.findall(r"^  (\d)\s+(\d)\s+\d+\s+(\S+)\s+([\d.]+) s\s+([\d.]+ MiB)$", r.err, re.MULTILINE)
    assert [(a, c) for a, _, c, _, _ in rows] == [("0", "143"), ("1", "3"), ("2", "143")]


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_kill_grace_period_is_configurable(scripts):
    script = scripts.write(
        "stubborn.py",
        """
        import os, signal, sys, time
        if os.environ["RANK"] == "1":
            time.sleep(0.3)
            sys.exit(5)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        time.sleep(60)
        """,
    )
    r = monarch_launch("--nproc-per-node", "2", "--kill-grace-period", "1", script)
    assert r.rc == 1, r
    assert r.seconds < 15, r
    assert re.search(r"Unable to shutdown process \d+ via SIGTERM, forcefully exiting via SIGKILL", r.err)
    assert re.search(r"exitcode  : -9 \(pid: \d+\)  \(SIGKILL\)\n", r.err)
    assert "traceback : Signal 9 (SIGKILL) received by PID" in r.err


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_restarts_get_incremented_count_and_a_fresh_rendezvous(scripts, tmp_path):
    script = scripts.write(
        "flaky.py",
        """
        import os, sys, time
        count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        with open(os.path.join(sys.argv[1], f"r{os.environ['RANK']}-a{count}"), "w") as fp:
            fp.write(os.environ["MASTER_PORT"] + " " + os.environ["TORCHELASTIC_ERROR_FILE"])
        if os.environ["RANK"] == "1" and count < 2:
            while not os.path.exists(os.path.join(sys.argv[1], f"r0-a{count}")):
                time.sleep(0.01)  # fail only once rank 0 has written its record
            sys.exit(1)
        """,
    )
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    r = monarch_launch(
        "--nproc-per-node", "2", "--max-restarts", "3", "--log-dir", str(logs), script, str(out)
    )
    assert r.rc == 0, r
    seen = {p.name: p.read_text().split() for p in out.iterdir()}
    assert sorted(seen) == ["r0-a0", "r0-a1", "r0-a2", "r1-a0", "r1-a1", "r1-a2"]
    ports = {a: seen[f"r0-a{a}"][0] for a in range(3)}
    assert len(set(ports.values())) == 3, ports  # a new store, on a new port, for every attempt
    assert all(seen[f"r1-a{a}"][0] == ports[a] for a in range(3))
    (run_dir,) = logs.iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["attempt_0", "attempt_1", "attempt_2"]
    assert seen["r1-a2"][1] == str(run_dir / "attempt_2" / "1" / "error.json")

    # Out of restarts: the last attempt's failures are reported.
    r = monarch_launch("--nproc-per-node", "2", "--max-restarts", "1", script, str(out))
    assert r.rc == 1, r
    assert r.err.count("failed (exitcode: 1) local_rank: 1") == 2
    assert "rank      : 1 (local_rank: 1)\n  exitcode  : 1" in r.err


@pytest.mark.timeout(60)
def test_error_file_contents_in_summary_and_parent_error_file(scripts, tmp_path):
    # What torch's @record writes (it is exercised for real in test_conformance.py).
    script = scripts.write(
        "record.py",
        """
        import json, os, sys, time, traceback
        if os.environ["RANK"] == "1":
            try:
                raise ValueError("boom from rank 1")
            except ValueError as e:
                data = {"message": {"message": f"ValueError: {e}", "extraInfo": {
                    "py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}}}
                with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as fp:
                    json.dump(data, fp)
                raise
        """,
    )
    parent = tmp_path / "parent.json"
    r = monarch_launch(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
        script,
        env=clean_env(TORCHELASTIC_ERROR_FILE=str(parent)),
    )
    assert r.rc == 1, r
    assert re.search(
        r"error_file: \S+/attempt_0/1/error\.json\n  traceback : Traceback \(most recent call last\):\n    File ",
        r.err,
    )
    assert "\n  ValueError: boom from rank 1\n" in r.err
    data = json.loads(parent.read_text())
    assert data["message"]["message"] == "ValueError: boom from rank 1"
    assert data["message"]["errorCode"] == 1


# -- signals ----------------------------------------------------------------------------------------------


SIGNAL_AWARE = """
import os, signal, sys, time
rank = os.environ["RANK"]
def handler(signum, frame):
    print(f"rank{rank} got {signal.Signals(signum).name}", flush=True)
    sys.exit(0)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2):
    signal.signal(s, handler)
print(f"rank{rank} ready", flush=True)
time.sleep(60)
"""


def _wait_ready(proc, n: int) -> list[psutil.Process]:
    return wait_until(lambda: len(workers_of(proc.pid)) == n and workers_of(proc.pid), 30, "workers")  # type: ignore[return-value]


def _wait_for_line(path: Path, text: str, count: int) -> None:
    wait_until(lambda: path.exists() and path.read_text().count(text) >= count, 30, f"{count}x {text!r}")


def _start_signal_aware_job(scripts, tmp_path: Path) -> tuple[subprocess.Popen, list[psutil.Process], Path]:
    """Two workers of SIGNAL_AWARE, each past installing its handlers: (launcher, workers, log dir)."""
    script = scripts.write("sigs.py", SIGNAL_AWARE)
    logs = tmp_path / "logs"
    proc = start_launcher("--nproc-per-node", "2", "--log-dir", str(logs), "-r", "1", script)
    workers = _wait_ready(proc, 2)
    wait_until(
        lambda: (
            len(list(logs.glob("*/attempt_0/*/stdout.log"))) == 2
            and all("ready" in p.read_text() for p in logs.glob("*/attempt_0/*/stdout.log"))
        ),
        30,
        "ready",
    )
    return proc, workers, logs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_and_launcher_exits_1(scripts, tmp_path, sig):
    proc, workers, logs = _start_signal_aware_job(scripts, tmp_path)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert f"Received {int(sig)} death signal, shutting down workers" in err
    assert f"SignalException: Process {proc.pid} got signal: {int(sig)}" in err
    texts = [p.read_text() for p in sorted(logs.glob("*/attempt_0/*/stdout.log"))]
    assert [f"got {sig.name}" in t for t in texts] == [True, True]
    assert not alive(workers)


def _signal_a_helper_thread(pid: int, sig: int) -> None:
    """Deliver ``sig`` to a thread of ``pid`` other than its main thread (``tgkill``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "tgkill"):
        pytest.skip("this C library has no tgkill (glibc >= 2.30 has it)")
    helpers = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    assert helpers, "the launcher runs its event loop on a thread of its own"
    if libc.tgkill(pid, helpers[0], sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


@pytest.mark.timeout(60)
def test_a_signal_taken_by_a_helper_thread_still_stops_the_job(scripts, tmp_path):
    # The kernel may hand a process-directed signal to any thread; the launcher's main
    # thread must still notice it, however long it would otherwise wait for an event.
    proc, workers, _ = _start_signal_aware_job(scripts, tmp_path)
    start = time.monotonic()
    _signal_a_helper_thread(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert time.monotonic() - start < 10, err
    assert "Received 15 death signal, shutting down workers" in err
    assert not alive(workers)


@pytest.mark.timeout(60)
def test_shutdown_timeout_then_sigkill_and_custom_signal_list(scripts, tmp_path):
    script = scripts.write(
        "deaf.py",
        """
        import os, signal, sys, time
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        open(os.path.join(sys.argv[1], "deaf-" + os.environ["RANK"]), "w").close()
        time.sleep(60)
        """,
    )
    proc = start_launcher(
        "--nproc-per-node",
        "2",
        "--signals-to-handle",
        "SIGUSR2",
        "--shutdown-timeout",
        "1",
        script,
        str(tmp_path),
    )
    workers = _wait_ready(proc, 2)
    wait_until(lambda: len(list(tmp_path.glob("deaf-*"))) == 2, 30, "both ranks to ignore SIGUSR2")
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGUSR2)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert 0.9 < time.monotonic() - start < 10
    assert len(re.findall(r"Sending process \d+ closing signal SIGUSR2", err)) == 2
    assert len(re.findall(r"forcefully exiting via SIGKILL", err)) == 2
    assert not alive(workers)


@pytest.mark.timeout(60)
def test_kill_9_of_the_launcher_leaves_no_worker(scripts):
    script = scripts.write("sleepy.py", "import time\nprint('ready', flush=True)\ntime.sleep(60)\n")
    proc = start_launcher("--nproc-per-node", "2", script)
    workers = _wait_ready(proc, 2)
    proc.kill()
    proc.communicate(timeout=10)
    wait_until(lambda: not alive(workers), 10, "workers to exit after kill -9 of the launcher")


@pytest.mark.timeout(60)
def test_sigusr1_prints_every_ranks_stack(scripts, tmp_path):
    script = scripts.write(
        "stuck.py",
        """
        import time
        def stuck_in_here():
            print("ready", flush=True)
            time.sleep(60)
        stuck_in_here()
        """,
    )
    logs = tmp_path / "logs"
    proc = start_launcher("--nproc-per-node", "2", "--log-dir", str(logs), "-t", "1", script)
    _wait_ready(proc, 2)
    wait_until(
        lambda: (
            all("ready" in p.read_text() for p in logs.glob("*/attempt_0/*/stdout.log"))
            and len(list(logs.glob("*/attempt_0/*/stdout.log"))) == 2
        ),
        30,
        "ready",
    )
    try:
        os.kill(proc.pid, signal.SIGUSR1)
        err_lines: list[str] = []

        def dumped() -> bool:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            err_lines.append(line)
            return "=" * 20 in line and "Python stacks" not in line and len(err_lines) > 3

        wait_until(dumped, 30, "the stack dump")
        dump = "".join(err_lines)
        for rank in (0, 1):
            assert f"[rank{rank}]: Thread MainThread (most recent call last):" in dump, dump
            assert re.search(
                rf"\[rank{rank}\]:   File \"{re.escape(script)}\", line \d+, in stuck_in_here", dump
            )
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 1


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_hang_timeout_prints_stacks_when_nobody_prints(scripts):
    script = scripts.write(
        "quiet.py",
        """
        import os, time
        print("rank", os.environ["RANK"], "starts", flush=True)
        def waiting_quietly():
            time.sleep(3)
        waiting_quietly()
        print("rank", os.environ["RANK"], "ends", flush=True)
        """,
    )
    r = monarch_launch("--nproc-per-node", "2", "--hang-timeout", "1", script)
    assert r.rc == 0, r
    assert "no rank printed anything or exited for" in r.err
    assert re.search(r"\[rank1\]:   File \".*quiet.py\", line \d+, in waiting_quietly", r.err)
    assert sorted(re.findall(r"rank (\d) ends", r.out)) == ["0", "1"]


# -- logs -------------------------------------------------------------------------------------------------


OUTPUT = """
import os, sys
r = os.environ["RANK"]
print(f"out-line1 from rank{r}")
print(f"err-line1 from rank{r}", file=sys.stderr)
print(f"needle in rank{r}")
"""


@pytest.mark.timeout(60)
def test_redirects_write_exact_bytes_to_torchrun_layout(scripts, tmp_path):
    script = scripts.write("out.py", OUTPUT)
    logs = tmp_path / "logs"
    r = monarch_launch(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(logs),
        "-r",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        "--rdzv-id",
        "job7",
        script,
    )
    assert r.rc == 0, r
    assert "rank" not in r.out and "err-line1" not in r.err
    (run_dir,) = logs.iterdir()
    assert re.fullmatch(r"job7_[a-z0-9_]{8}", run_dir.name)
    files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    assert files == [
        "attempt_0",
        "attempt_0/0",
        "attempt_0/0/stderr.log",
        "attempt_0/0/stdout.log",
        "attempt_0/1",
        "attempt_0/1/stderr.log",
        "attempt_0/1/stdout.log",
    ]
    assert (run_dir / "attempt_0/1/stdout.log").read_text() == "out-line1 from rank1\nneedle in rank1\n"
    assert (run_dir / "attempt_0/0/stderr.log").read_text() == "err-line1 from rank0\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("template", [None, "[${role_name}|${rank}|${local_rank}] "])
def test_tee_prefixes_lines_and_duplicate_filters(scripts, tmp_path, template):
    script = scripts.write("out.py", OUTPUT)
    logs = tmp_path / "logs"
    env = clean_env(**({"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": template} if template else {}))
    r = monarch_launch(
        "--nproc-per-node",
        "2",
        "--role",
        "trainer",
        "--log-dir",
        str(logs),
        "-t",
        "3",
        "--duplicate-stdout-filters",
        "needle",
        script,
        env=env,
    )
    assert r.rc == 0, r
    prefix = (lambda lr: f"[trainer{lr}]:") if template is None else (lambda lr: f"[trainer|{lr}|{lr}] ")
    for lr in (0, 1):
        assert f"{prefix(lr)}out-line1 from rank{lr}\n" in r.out
        assert f"{prefix(lr)}err-line1 from rank{lr}\n" in r.err
    (run_dir,) = logs.iterdir()
    assert (run_dir / "attempt_0/0/stdout.log").read_text() == "out-line1 from rank0\nneedle in rank0\n"
    dup = (run_dir / "attempt_0/filtered_stdout.log").read_text().splitlines()
    assert sorted(dup) == [f"{prefix(0)}needle in rank0", f"{prefix(1)}needle in rank1"]


@pytest.mark.timeout(60)
def test_local_ranks_filter(scripts, tmp_path):
    script = scripts.write("out.py", OUTPUT)
    r = monarch_launch("--nproc-per-node", "2", "--local-ranks-filter", "0", script)
    assert r.rc == 0, r
    assert "out-line1 from rank0" in r.out and "rank1" not in r.out and "rank1" not in r.err

    logs = tmp_path / "logs"
    r = monarch_launch(
        "--nproc-per-node", "2", "-t", "3", "--local-ranks-filter", "1", "--log-dir", str(logs), script
    )
    assert r.rc == 0, r
    assert "[default1]:out-line1 from rank1" in r.out and "rank0" not in r.out
    (run_dir,) = logs.iterdir()
    assert (run_dir / "attempt_0/0/stdout.log").read_text().startswith("out-line1 from rank0")


@pytest.mark.timeout(60)
def test_no_temporary_directory_is_left_behind(scripts, tmp_path):
    script = scripts.write("out.py", OUTPUT)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = set(os.listdir(tmp))
    r = monarch_launch(
        "--nproc-per-node",
        "2",
        "-r",
        "3",
        "--summary",
        "--hang-timeout",
        "30",
        script,
        env=clean_env(TMPDIR=str(tmp)),
    )
    assert r.rc == 0, r
    left = [n for n in set(os.listdir(tmp)) - before if not n.startswith("monarch-")]
    assert left == [], left  # torchrun leaves a torchelastic_* directory per run
