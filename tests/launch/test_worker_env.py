"""Worker environment and worker command: torchrun 2.13's, value for value.

The table tests restate the worker environment torchrun 2.13 gives each rank (what
torchrun's ``LocalElasticAgent`` sets). The conformance test runs the real
``torchrun`` on a script that dumps its environment and checks that
:func:`worker_environ` reproduces every variable, given only the facts torchrun
decides at run time (master port, run id, error-file path).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from monarch._src.launch.cli import parse_args
from monarch._src.launch.command import EntryKind, WorkerCommand, build_worker_command
from monarch._src.launch.config import LaunchConfigError
from monarch._src.launch.worker_env import (
    default_master_addr,
    error_file_path,
    needs_omp_banner,
    timer_file_path,
    worker_env_vars,
    worker_environ,
)

TORCHRUN_KEYS = {
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "LOCAL_RANK",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
}


def _vars(
    argv: list[str], local_rank: int, parent: dict[str, str] | None = None, **kw: Any
) -> dict[str, str]:
    env = {} if parent is None else parent
    config = parse_args(argv, environ=env)
    kw.setdefault("master_addr", default_master_addr(config))
    kw.setdefault("master_port", config.master_port)
    kw.setdefault("error_file", f"/logs/attempt_0/{local_rank}/error.json")
    return worker_env_vars(config, local_rank, parent_env=env, **kw)


def test_spec_2_1_observed_rank1_of_two() -> None:
    """Section 2.1: ``torchrun --nproc-per-node=2 fullenv.py``, rank 1."""
    got = _vars(
        ["--nproc-per-node=2", "fullenv.py"],
        1,
        master_addr="localhost",
        master_port=33931,
        run_id="c5499a6d-ae92-4097-b255-57dd92cd8dfd",
        error_file="/t/attempt_0/1/error.json",
    )
    assert got == {
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "33931",
        "OMP_NUM_THREADS": "1",
        "RANK": "1",
        "ROLE_NAME": "default",
        "ROLE_RANK": "1",
        "ROLE_WORLD_SIZE": "2",
        "TORCHELASTIC_ERROR_FILE": "/t/attempt_0/1/error.json",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_RUN_ID": "c5499a6d-ae92-4097-b255-57dd92cd8dfd",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "WORLD_SIZE": "2",
    }


def test_default_run_id_is_the_generated_uuid() -> None:
    config = parse_args(["x.py"], environ={})
    got = worker_env_vars(config, 0, master_addr="h", master_port=1, error_file="", parent_env={})
    assert got["TORCHELASTIC_RUN_ID"] == config.rdzv_id
    assert uuid.UUID(config.rdzv_id).version == 4


@pytest.mark.parametrize(
    "argv,local_rank,parent,expected",
    [
        # nproc 1: no OMP_NUM_THREADS, no banner.
        (["x.py"], 0, {}, {"OMP_NUM_THREADS": None, "WORLD_SIZE": "1", "RANK": "0"}),
        # nproc 3: OMP_NUM_THREADS=1, ranks 0..2.
        (
            ["--nproc-per-node=3", "x.py"],
            2,
            {},
            {"OMP_NUM_THREADS": "1", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3", "RANK": "2"},
        ),
        # A user value passes through unchanged.
        (["--nproc-per-node=3", "x.py"], 0, {"OMP_NUM_THREADS": "4"}, {"OMP_NUM_THREADS": "4"}),
        # TORCH_NCCL_ASYNC_ERROR_HANDLING defaults to 1 and honours a parent 0.
        (["x.py"], 0, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}),
        # Static: MASTER_ADDR/PORT from the flags, run id "none".
        (
            ["--master-port=29511", "--nproc-per-node=2", "x.py"],
            1,
            {},
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29511",
                "TORCHELASTIC_RUN_ID": "none",
                "TORCHELASTIC_USE_AGENT_STORE": "True",
            },
        ),
        # Role and restart budget.
        (
            ["--role=trainer", "--max-restarts=3", "x.py"],
            0,
            {},
            {"ROLE_NAME": "trainer", "TORCHELASTIC_MAX_RESTARTS": "3"},
        ),
        # CUDA_VISIBLE_DEVICES passes through in normal mode.
        (
            ["--nproc-per-node=2", "x.py"],
            1,
            {"CUDA_VISIBLE_DEVICES": "3,4"},
            {"CUDA_VISIBLE_DEVICES": "3,4", "LOCAL_RANK": "1"},
        ),
        # Virtual local rank: LOCAL_RANK 0, one device each from the parent list.
        (
            ["--virtual-local-rank", "--nproc-per-node=2", "x.py"],
            1,
            {"CUDA_VISIBLE_DEVICES": "5, 7"},
            {"CUDA_VISIBLE_DEVICES": "7", "LOCAL_RANK": "0", "RANK": "1"},
        ),
        (
            ["--virtual-local-rank", "--nproc-per-node=2", "x.py"],
            1,
            {},
            {"CUDA_VISIBLE_DEVICES": "1", "LOCAL_RANK": "0"},
        ),
        # Signals list leaks in verbatim.
        (
            ["--signals-to-handle=SIGTERM,SIGUSR1", "x.py"],
            0,
            {},
            {"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGUSR1"},
        ),
        # PET_* variables are ordinary inherited variables, not added keys.
        (["x.py"], 0, {"PET_ROLE": "pet"}, {"ROLE_NAME": "pet", "PET_ROLE": None}),
    ],
)
def test_documented_values(
    argv: list[str], local_rank: int, parent: dict[str, str], expected: dict[str, str | None]
) -> None:
    got = _vars(argv, local_rank, parent)
    assert TORCHRUN_KEYS <= set(got)
    for key, value in expected.items():
        assert got.get(key) == value, key


def test_restart_count_and_agent_store_flag() -> None:
    got = _vars(["--max-restarts=2", "x.py"], 0, restart_count=1, use_agent_store=False)
    assert got["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert got["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_virtual_local_rank_with_too_few_devices() -> None:
    with pytest.raises(LaunchConfigError, match="exceeds available GPUs"):
        _vars(["--virtual-local-rank", "--nproc-per-node=2", "x.py"], 1, {"CUDA_VISIBLE_DEVICES": "5"})


def test_static_two_nodes_from_spec_5_2() -> None:
    """Section 5.2: node 1 of 2, 2 workers each: RANK 2,3, GROUP_RANK 1, WORLD_SIZE 4."""
    argv = [
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        "--master-port=29560",
        "mn.py",
    ]
    config = parse_args(argv, environ={})
    envs = [
        worker_env_vars(
            config,
            lr,
            node_rank=config.node_rank,
            master_addr=config.master_addr,
            master_port=config.master_port,
            error_file="",
            parent_env={},
        )
        for lr in range(2)
    ]
    assert [e["RANK"] for e in envs] == ["2", "3"]
    assert {e["GROUP_RANK"] for e in envs} == {"1"}
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"}
    assert [e["ROLE_RANK"] for e in envs] == ["2", "3"]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["TORCHELASTIC_RUN_ID"]) for e in envs} == {
        ("127.0.0.1", "29560", "none")
    }


def test_heterogeneous_nodes_use_offsets() -> None:
    """Spec 2.2: local world sizes 1,2,3 give contiguous global ranks 0..5."""
    sizes = [1, 2, 3]
    ranks = []
    for node, size in enumerate(sizes):
        config = parse_args(
            ["--nnodes=3", "--rdzv-backend=c10d", "--rdzv-endpoint=h", f"--nproc-per-node={size}", "x.py"],
            environ={},
        )
        for lr in range(size):
            env = worker_env_vars(
                config,
                lr,
                node_rank=node,
                rank_offset=sum(sizes[:node]),
                world_size=sum(sizes),
                master_addr="h",
                master_port=1,
                error_file="",
                parent_env={},
            )
            assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "6"
            assert env["LOCAL_WORLD_SIZE"] == str(size)
            ranks.append(int(env["RANK"]))
    assert ranks == list(range(6))


def test_elastic_needs_round_size_and_ranks_are_checked() -> None:
    config = parse_args(["--nnodes=1:2", "--rdzv-backend=c10d", "x.py"], environ={})
    with pytest.raises(ValueError, match="group_world_size"):
        worker_env_vars(config, 0, master_addr="h", master_port=1, error_file="", parent_env={})
    got = worker_env_vars(
        config,
        0,
        group_world_size=2,
        node_rank=1,
        master_addr="h",
        master_port=1,
        error_file="",
        parent_env={},
    )
    assert (got["RANK"], got["WORLD_SIZE"], got["GROUP_WORLD_SIZE"]) == ("1", "2", "2")
    with pytest.raises(ValueError):
        worker_env_vars(
            config, 1, group_world_size=2, master_addr="h", master_port=1, error_file="", parent_env={}
        )


def test_helpers() -> None:
    config = parse_args(["--nproc-per-node=2", "x.py"], environ={})
    assert needs_omp_banner(config, {}) and not needs_omp_banner(config, {"OMP_NUM_THREADS": "2"})
    assert not needs_omp_banner(parse_args(["x.py"], environ={}), {})
    assert error_file_path(config, "/r/attempt_1", 1) == "/r/attempt_1/1/error.json"
    devnull = parse_args(["--log-dir", os.devnull, "x.py"], environ={})
    assert error_file_path(devnull, "/r/attempt_0", 0) == ""
    assert timer_file_path({}) is None
    assert timer_file_path({"TORCHELASTIC_TIMER_FILE": "/p"}) == "/p"
    made = timer_file_path({"TORCHELASTIC_ENABLE_FILE_TIMER": "1"})
    assert made is not None and os.path.basename(made).startswith("watchdog_timer_")
    assert default_master_addr(parse_args(["--master-port=1", "--master-addr=m", "x.py"], environ={})) == "m"
    assert default_master_addr(parse_args(["--local-addr=me", "x.py"], environ={})) == "me"
    got = worker_env_vars(
        config, 0, master_addr="h", master_port=1, error_file="", timer_file="/p", parent_env={}
    )
    assert got["TORCHELASTIC_TIMER_FILE"] == "/p"


def test_worker_environ_inherits_everything() -> None:
    parent = {"SENTINEL": "x", "RANK": "99", "PATH": "/bin"}
    config = parse_args(["x.py"], environ=parent)
    env = worker_environ(config, 0, master_addr="h", master_port=1, error_file="", parent_env=parent)
    assert env["SENTINEL"] == "x" and env["PATH"] == "/bin"
    assert env["RANK"] == "0"  # the per-worker keys win
    assert parent["RANK"] == "99"  # and the parent mapping is not modified


# ---------------------------------------------------------------------------
# worker command
# ---------------------------------------------------------------------------


def test_command_kinds(tmp_path: Path) -> None:
    def cmd(argv: list[str], env: dict[str, str] | None = None) -> WorkerCommand:
        return build_worker_command(parse_args(argv, environ={}), environ=env or {})

    c = cmd(["s.py", "a"])
    assert c.kind is EntryKind.SCRIPT and c.argv == ("s.py", "a") and c.unbuffered
    assert c.subprocess_argv == (sys.executable, "-u", "s.py", "a")
    assert c.summary_name == "s.py" and c.binary == sys.executable
    c = cmd(["-m", "pkg.mod", "a"])
    assert c.kind is EntryKind.MODULE and c.summary_name == "pkg.mod"
    assert c.subprocess_argv == (sys.executable, "-u", "-m", "pkg.mod", "a")
    c = cmd(["--no-python", "/bin/false"])
    assert c.kind is EntryKind.EXECUTABLE and not c.runs_in_process and not c.unbuffered
    assert c.subprocess_argv == ("/bin/false",) and c.summary_name == "/bin/false"
    c = cmd(["--run-path", "-m", "--no-python", "/abs/s.py", "q"])
    assert c.kind is EntryKind.RUN_PATH and c.subprocess_argv is None
    assert c.summary_name == "run_script_path" and not c.unbuffered
    c = cmd(["s.py"], {"PYTHON_EXEC": "/usr/bin/python3"})
    assert c.subprocess_argv == ("/usr/bin/python3", "-u", "s.py")
    assert c.summary_name == "/usr/bin/python3"  # torchrun's quirk, kept
    config = parse_args(["s.py"], environ={})
    bad = type(config)(**{**config.__dict__, "no_python": True, "module": True})
    with pytest.raises(LaunchConfigError, match="--no-python"):
        build_worker_command(bad)


def test_sys_path0(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "s.py").write_text("")
    link = tmp_path / "link.py"
    link.symlink_to(real / "s.py")
    script = WorkerCommand(EntryKind.SCRIPT, str(link), (), sys.executable)
    assert script.sys_path0() == str(real.resolve())
    module = WorkerCommand(EntryKind.MODULE, "m", (), sys.executable)
    assert module.sys_path0(cwd="/w") == "/w"
    assert WorkerCommand(EntryKind.RUN_PATH, "/a.py", (), sys.executable).sys_path0() is None


_PROBE = (
    "import sys, json, os\n"
    "print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'name': __name__,\n"
    "                  'wt': sys.stdout.write_through}))\n"
    "raise SystemExit(int(os.environ.get('CODE', '0')))\n"
)


@pytest.mark.parametrize("kind", [EntryKind.SCRIPT, EntryKind.MODULE, EntryKind.RUN_PATH])
def test_run_in_process_matches_python(kind: EntryKind, tmp_path: Path) -> None:
    """``WorkerCommand.run`` in a fresh interpreter behaves like ``python [-m] ...``."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text(_PROBE)
    target = "pkg.probe" if kind is EntryKind.MODULE else str(pkg / "probe.py")
    runner = (
        "import sys\n"
        "from monarch._src.launch.command import WorkerCommand, EntryKind\n"
        f"WorkerCommand(EntryKind({kind.value!r}), {target!r}, ('a', '--b'), sys.executable).run()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["CODE"] = "3"
    ours = subprocess.run(
        [sys.executable, "-c", runner], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    flag = ["-m"] if kind is EntryKind.MODULE else []
    real = subprocess.run(
        [sys.executable, "-u", *flag, target, "a", "--b"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ours.returncode == real.returncode == 3, ours.stderr
    got, want = json.loads(ours.stdout), json.loads(real.stdout)
    assert got["argv"] == want["argv"] and got["name"] == want["name"] == "__main__"
    if kind is EntryKind.RUN_PATH:
        assert got["wt"] is False
    else:
        assert got["path0"] == want["path0"] and got["wt"] is want["wt"] is True


def test_executable_cannot_run_in_process() -> None:
    with pytest.raises(LaunchConfigError):
        WorkerCommand(EntryKind.EXECUTABLE, "/bin/true", (), sys.executable).run()


# ---------------------------------------------------------------------------
# conformance against a real torchrun
# ---------------------------------------------------------------------------

_DUMP = (
    "import json, os, sys\n"
    "out = sys.argv[1]\n"
    "rec = {'env': dict(os.environ), 'argv': sys.argv, 'orig_argv': sys.orig_argv,\n"
    "       'path0': sys.path[0], 'pid': os.getpid()}\n"
    "with open(os.path.join(out, 'w%s.json' % os.environ['RANK']), 'w') as f:\n"
    "    json.dump(rec, f)\n"
)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill_leftovers(out_dirs: list[Path]) -> None:
    for out in out_dirs:
        for dump in out.glob("w*.json"):
            try:
                pid = json.loads(dump.read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
            except (ValueError, KeyError, ProcessLookupError, PermissionError):
                pass


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_environment_matches_real_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("no torchrun next to the interpreter")
    (tmp_path / "dump.py").write_text(_DUMP)
    (tmp_path / "dumpmod.py").write_text(_DUMP)
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "TMPDIR": str(tmp_path),
        "SENTINEL": "kept",
    }
    port = _free_port()
    runs: list[tuple[list[str], dict[str, str]]] = [
        # The implicit single-node default: c10d on localhost:0, uuid run id.
        (["--nproc-per-node", "2", "--log-dir", "LOGS", "dump.py", "OUT"], dict(base)),
        # Static, user OMP/NCCL values, virtual local rank, role, restarts budget.
        (
            [
                "--nproc-per-node=3",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "--rdzv-id=job7",
                "--role=trainer",
                "--max-restarts=2",
                "--virtual-local-rank",
                "--log-dir=LOGS",
                "dump.py",
                "OUT",
            ],
            {
                **base,
                "OMP_NUM_THREADS": "4",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
                "CUDA_VISIBLE_DEVICES": "5,7,9",
            },
        ),
        # --standalone via PET_*, a module, no log files, an inherited timer path.
        (
            ["-m", "dumpmod", "OUT"],
            {
                **base,
                "PET_STANDALONE": "1",
                "PET_NPROC_PER_NODE": "1",
                "PET_LOG_DIR": os.devnull,
                "PET_ROLE": "pet",
                "TORCHELASTIC_TIMER_FILE": str(tmp_path / "timer"),
                "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM",
            },
        ),
    ]
    procs = []
    outs: list[Path] = []
    for i, (argv, env) in enumerate(runs):
        out = tmp_path / f"out{i}"
        out.mkdir()
        outs.append(out)
        argv[:] = [a.replace("OUT", str(out)).replace("LOGS", str(tmp_path / f"logs{i}")) for a in argv]
        procs.append(
            subprocess.Popen(
                [str(torchrun), *argv],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    try:
        results = [p.communicate(timeout=100) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        _kill_leftovers(outs)

    for (argv, env), proc, (_, err), out in zip(runs, procs, results, outs):
        assert proc.returncode == 0, err
        config = parse_args(argv, environ=env)
        command = build_worker_command(config, environ=env)
        dumps = sorted(out.glob("w*.json"))
        assert len(dumps) == config.nproc_per_node
        banner = "Setting OMP_NUM_THREADS environment variable" in err
        assert banner == needs_omp_banner(config, env)
        for dump in dumps:
            rec = json.loads(dump.read_text())
            real = rec["env"]
            # Only these are decided at run time by torchrun.
            local_rank = int(real["RANK"])  # single node: RANK == local rank
            ours = worker_environ(
                config,
                local_rank,
                master_addr=real["MASTER_ADDR"],
                master_port=int(real["MASTER_PORT"]),
                run_id=real["TORCHELASTIC_RUN_ID"],
                error_file=real["TORCHELASTIC_ERROR_FILE"],
                timer_file=timer_file_path(env),
                parent_env=env,
            )
            assert ours == real
            # ... and those runtime facts have the documented shape.
            if config.rdzv_backend == "static":
                assert real["MASTER_ADDR"] == config.master_addr
                assert real["MASTER_PORT"] == str(config.master_port)
                assert real["TORCHELASTIC_RUN_ID"] == config.rdzv_id
            else:
                assert uuid.UUID(real["TORCHELASTIC_RUN_ID"]).version == 4
                assert int(real["MASTER_PORT"]) > 0
            if config.log_dir == os.devnull:
                assert real["TORCHELASTIC_ERROR_FILE"] == ""
            else:
                pattern = (
                    rf"{re.escape(config.log_dir or '')}/"
                    rf"{re.escape(real['TORCHELASTIC_RUN_ID'])}_[^/]+/attempt_0/"
                    rf"{local_rank}/error\.json"
                )
                assert re.fullmatch(pattern, real["TORCHELASTIC_ERROR_FILE"])
            # The command line and what the script sees.
            # argv[0] may name the same interpreter through another link (python vs python3).
            real_argv, our_argv = list(rec["orig_argv"]), list(command.subprocess_argv)
            assert os.path.realpath(real_argv[0]) == os.path.realpath(our_argv[0])
            assert real_argv[1:] == our_argv[1:]
            assert rec["path0"] == command.sys_path0(cwd=str(tmp_path))
            if command.kind is EntryKind.MODULE:  # python -m puts the file path in argv[0]
                assert rec["argv"] == [str(tmp_path / "dumpmod.py"), *command.argv[1:]]
            else:
                assert rec["argv"] == list(command.argv)
