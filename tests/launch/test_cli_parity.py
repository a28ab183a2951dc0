"""``python -m monarch.launch`` must parse exactly like torchrun 2.13.

Most tests put our parser side by side with the real one
(``torch.distributed.run.get_args_parser``) and compare namespaces, exit codes
and the validated configuration. torch is only needed by those tests; the
rest check behaviour documented in the torchrun spec without it.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from launch_helpers import _popen

from monarch._src.launch import cli
from monarch._src.launch.cli import (
    build_parser,
    config_from_namespace,
    cuda_device_count,
    parse_args,
    parse_args_or_exit,
    resolve_nproc_per_node,
)
from monarch._src.launch.command import EntryKind, build_worker_command
from monarch._src.launch.config import LaunchConfig, LaunchConfigError, Std, parse_std, std_to_map

OUR_DESTS = {
    "kill_grace_period": 30.0,
    "hang_timeout": None,
    "summary": False,
    "preload": "auto",
    "hosts": None,
}

# Variables that change what either parser or config builder sees.
_ENV_KNOBS = (
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
    "PYTHON_EXEC",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No PET_* or other torchrun knobs from the outside world."""
    for name in list(os.environ):
        if name.startswith("PET_") or name in _ENV_KNOBS:
            monkeypatch.delenv(name)
    # torchrun's config_from_args writes OMP_NUM_THREADS into os.environ;
    # set-then-delete registers an undo that removes it again.
    monkeypatch.setenv("OMP_NUM_THREADS", "0")
    monkeypatch.delenv("OMP_NUM_THREADS")
    return monkeypatch


@pytest.fixture
def torchrun() -> Any:
    return pytest.importorskip("torch.distributed.run")


def _ns(parser: argparse.ArgumentParser, argv: Sequence[str]) -> dict[str, Any]:
    return vars(parser.parse_args(list(argv)))


def _exit_code(parser_factory: Any, argv: Sequence[str]) -> int | str | None:
    try:
        parser_factory().parse_args(list(argv))
    except SystemExit as exc:
        return exc.code
    return "parsed"


# ---------------------------------------------------------------------------
# namespace parity
# ---------------------------------------------------------------------------

GOOD_ARGV: list[list[str]] = [
    ["s.py"],
    ["--nproc-per-node=4", "s.py", "a", "--b", "-m"],
    ["--nproc_per_node", "auto", "s.py"],
    ["--nproc-per=2", "s.py"],
    [
        "--nnodes",
        "1:2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "host:1234",
        "--rdzv-id",
        "job",
        "--rdzv-conf",
        "join_timeout=5,last_call_timeout=1",
        "s.py",
    ],
    [
        "--nnodes=2",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=[::1]:5",
        "--rdzv_id=x",
        "--rdzv_conf=a=b",
        "s.py",
    ],
    ["--standalone", "s.py"],
    ["--stand", "s.py"],
    ["--max-restarts", "3", "--monitor-interval", "0.5", "--start-method", "fork", "s.py"],
    ["--max_restarts=-1", "--monitor_interval=0", "--start_method=forkserver", "s.py"],
    ["--event-log-handler", "console", "--role", "trainer", "-m", "pkg.mod", "x"],
    ["--event_log_handler=null", "--module", "pkg.mod"],
    ["-mr3", "mod"],
    ["--no-python", "/bin/echo", "hi"],
    ["--no_python", "--no-py", "/bin/echo"],
    ["--run-path", "/abs/s.py", "--flag"],
    ["--run_path", "-m", "--no-python", "/abs/s.py"],
    ["--log-dir", "/tmp/x", "-r", "3", "-t", "0:1,1:2", "s.py"],
    ["--log_dir=/dev/null", "--redirects=1", "--tee=2", "s.py"],
    ["-r3", "-t0", "s.py"],
    [
        "--local-ranks-filter",
        "0,1",
        "--duplicate-stdout-filters",
        "a,,b,c",
        "--duplicate-stderr-filters",
        "",
        "s.py",
    ],
    ["--local_ranks_filter=x", "--duplicate_stdout_filters=,", "--duplicate_stderr_filters=q", "s.py"],
    ["--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29511", "--local-addr", "me", "s.py"],
    ["--node_rank=0", "--master_addr=localhost", "--master_port=0", "--local_addr=a", "s.py"],
    ["--logs-specs", "default", "--numa-binding", "socket", "s.py"],
    ["--logs_specs=nope", "--numa_binding=core-complex", "s.py"],
    ["--signals-to-handle", "SIGTERM,SIGUSR1", "--shutdown-timeout", "5", "--virtual-local-rank", "s.py"],
    ["--signals_to_handle=", "--shutdown_timeout=-1", "--virtual_local_rank", "s.py"],
    ["--", "s.py"],
    ["s.py", "--", "x"],
    ["s.py", "--nproc-per-node=5", "--standalone"],
    ["--nnodes=1:2:3", "--nproc-per-node=gpu", "-r", "9", "s.py"],
]

BAD_ARGV: list[list[str]] = [
    [],
    ["--nproc-per-node=2"],
    ["--nproc=2", "s.py"],
    ["--rdzv", "x", "s.py"],
    ["--max-restarts", "x", "s.py"],
    ["--monitor-interval", "fast", "s.py"],
    ["--start-method", "thread", "s.py"],
    ["--numa-binding", "foo", "s.py"],
    ["--master-port", "abc", "s.py"],
    ["--node-rank", "1.5", "s.py"],
    ["--shutdown-timeout", "1.5", "s.py"],
    ["--bogus", "s.py"],
    ["--nnodes"],
    ["--log-dir"],
    ["-m"],
    ["--standalone=1", "s.py"],
    ["--max", "1", "s.py"],
]

# (environment, argv): PET_* fallbacks, including the quirks.
PET_CASES: list[tuple[dict[str, str], list[str]]] = [
    ({"PET_NPROC_PER_NODE": "2"}, ["s.py"]),
    ({"PET_NPROC_PER_NODE": "2"}, ["--nproc-per-node=1", "s.py"]),
    ({"PET_STANDALONE": "1", "PET_ROLE": "pet"}, ["s.py"]),
    ({"PET_STANDALONE": "0"}, ["--standalone", "s.py"]),
    ({"PET_STANDALONE": "0"}, ["s.py"]),
    ({"PET_MAX_RESTARTS": "2", "PET_MONITOR_INTERVAL": "0.5"}, ["s.py"]),
    ({"PET_MAX_RESTARTS": "x"}, ["--max-restarts", "1", "s.py"]),
    ({"PET_MODULE": "1"}, ["platform"]),
    ({"PET_NO_PYTHON": "1", "PET_RUN_PATH": "1", "PET_VIRTUAL_LOCAL_RANK": "1"}, ["x"]),
    ({"PET_DUPLICATE_STDOUT_FILTERS": "a,b", "PET_DUPLICATE_STDERR_FILTERS": "c,,d"}, ["s.py"]),
    ({"PET_LOGS_SPECS": "x", "PET_NUMA_BINDING": "node"}, ["s.py"]),
    ({"PET_MASTER_PORT": "1234", "PET_MASTER_ADDR": "h", "PET_NODE_RANK": "3"}, ["s.py"]),
    ({"PET_NNODES": "", "PET_RDZV_ID": ""}, ["s.py"]),
    ({"PET_START_METHOD": "bogus"}, ["s.py"]),
    ({"PET_SHUTDOWN_TIMEOUT": "7", "PET_SIGNALS_TO_HANDLE": "SIGUSR1"}, ["s.py"]),
    ({"PET_REDIRECTS": "3", "PET_TEE": "0:1", "PET_LOG_DIR": "/x", "PET_LOCAL_RANKS_FILTER": "1"}, ["s.py"]),
    (
        {
            "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": "h:1",
            "PET_RDZV_CONF": "a=1",
            "PET_LOCAL_ADDR": "me",
            "PET_EVENT_LOG_HANDLER": "console",
        },
        ["s.py"],
    ),
    ({"PET_TRAINING_SCRIPT": "other.py", "PET_TRAINING_SCRIPT_ARGS": "z"}, ["s.py"]),
]

PET_BAD_CASES: list[tuple[dict[str, str], list[str]]] = [
    ({"PET_MAX_RESTARTS": "x"}, ["s.py"]),
    ({"PET_MONITOR_INTERVAL": "soon"}, ["s.py"]),
    ({"PET_MASTER_PORT": "p"}, ["s.py"]),
    ({"PET_NODE_RANK": ""}, ["s.py"]),
]


def _assert_same_namespace(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> None:
    shared = {k: v for k, v in ours.items() if k not in OUR_DESTS}
    assert shared == dict(theirs)
    # Same types too (int 2 vs "2" would compare unequal anyway, but bool vs int would not).
    for key, value in theirs.items():
        assert type(shared[key]) is type(value), key


@pytest.mark.parametrize("argv", GOOD_ARGV, ids=" ".join)
def test_namespace_matches_torchrun(argv: list[str], clean_env: Any, torchrun: Any) -> None:
    ours = _ns(build_parser(), argv)
    theirs = _ns(torchrun.get_args_parser(), argv)
    _assert_same_namespace(ours, theirs)
    for dest, default in OUR_DESTS.items():
        assert ours[dest] == default


@pytest.mark.parametrize("argv", BAD_ARGV, ids=lambda a: " ".join(a) or "<empty>")
def test_bad_argv_exits_2_like_torchrun(
    argv: list[str], clean_env: Any, torchrun: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code(torchrun.get_args_parser, argv) == 2
    theirs_err = capsys.readouterr().err.splitlines()[-1]
    assert _exit_code(build_parser, argv) == 2
    ours_err = capsys.readouterr().err.splitlines()[-1]
    # Same argparse complaint after the program name.
    assert ours_err.split("error: ", 1)[1] == theirs_err.split("error: ", 1)[1]


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["--h"], ["--he"], ["--help", "x"]])
def test_help_exits_0(argv: list[str], clean_env: Any, torchrun: Any) -> None:
    assert _exit_code(torchrun.get_args_parser, argv) == 0
    assert _exit_code(build_parser, argv) == 0


@pytest.mark.parametrize("env,argv", PET_CASES, ids=lambda x: repr(x))
def test_pet_env_matches_torchrun(
    env: dict[str, str], argv: list[str], clean_env: pytest.MonkeyPatch, torchrun: Any
) -> None:
    for key, value in env.items():
        clean_env.setenv(key, value)
    ours = _ns(build_parser(), argv)
    theirs = _ns(torchrun.get_args_parser(), argv)
    _assert_same_namespace(ours, theirs)
    # The explicit mapping gives the same as the process environment.
    assert _ns(build_parser(dict(os.environ)), argv) == ours


@pytest.mark.parametrize("env,argv", PET_BAD_CASES, ids=lambda x: repr(x))
def test_bad_pet_value_exits_2_like_torchrun(
    env: dict[str, str], argv: list[str], clean_env: pytest.MonkeyPatch, torchrun: Any
) -> None:
    for key, value in env.items():
        clean_env.setenv(key, value)
    assert _exit_code(torchrun.get_args_parser, argv) == 2
    assert _exit_code(build_parser, argv) == 2


@pytest.mark.parametrize("name", ["PET_STANDALONE", "PET_MODULE", "PET_RUN_PATH"])
def test_non_integer_boolean_pet_fails_like_torchrun(
    name: str, clean_env: pytest.MonkeyPatch, torchrun: Any
) -> None:
    clean_env.setenv(name, "true")
    with pytest.raises(ValueError) as theirs:
        torchrun.get_args_parser()
    with pytest.raises(LaunchConfigError) as ours:
        build_parser()
    assert str(ours.value) == str(theirs.value)
    assert ours.value.torchrun_error == "ValueError"


def test_our_extra_flags(clean_env: pytest.MonkeyPatch) -> None:
    ns = _ns(build_parser(), ["--kill-grace-period", "5", "--hang_timeout=2.5", "--summary", "s.py"])
    assert (ns["kill_grace_period"], ns["hang_timeout"], ns["summary"]) == (5.0, 2.5, True)
    clean_env.setenv("PET_SUMMARY", "1")
    clean_env.setenv("PET_KILL_GRACE_PERIOD", "1.5")
    config = parse_args(["--hang-timeout=0", "s.py"])
    assert (config.kill_grace_period, config.hang_timeout, config.summary) == (1.5, None, True)
    with pytest.raises(LaunchConfigError):
        parse_args(["--kill-grace-period=-1", "s.py"], environ={})
    with pytest.raises(LaunchConfigError):
        parse_args(["--hang-timeout=-3", "s.py"], environ={})


# ---------------------------------------------------------------------------
# validated configuration parity
# ---------------------------------------------------------------------------


class _Captured:
    config: Any = None
    entrypoint: Any = None
    args: tuple[Any, ...] = ()


def _torchrun_config(
    torchrun: Any, argv: Sequence[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> _Captured:
    """Run torchrun's real ``run()`` up to the point where it would launch."""
    import tempfile

    captured = _Captured()

    def fake_elastic_launch(config: Any, entrypoint: Any) -> Any:
        captured.config = config
        captured.entrypoint = entrypoint

        def call(*args: Any) -> None:
            captured.args = args

        return call

    monkeypatch.setattr(torchrun, "elastic_launch", fake_elastic_launch)
    # DefaultLogsSpecs mkdtemp()s a directory when --log-dir is absent.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    torchrun.run(torchrun.parse_args(list(argv)))
    return captured


def _is_uuid4(text: str) -> bool:
    try:
        return uuid.UUID(text).version == 4
    except ValueError:
        return False


CONFIG_CASES: list[tuple[dict[str, str], list[str]]] = [
    ({}, ["s.py"]),
    ({}, ["--nproc-per-node=3", "s.py", "x", "--y"]),
    ({}, ["--nproc-per-node=cpu", "s.py"]),
    ({}, ["--nproc-per-node=auto", "-m", "pkg.mod", "a"]),
    ({}, ["--nproc-per-node= 2", "--standalone", "--rdzv-id=ignored", "s.py"]),
    ({}, ["--master-port=29511", "--nproc-per-node=2", "s.py"]),
    ({}, ["--nnodes=2", "--node-rank=1", "--master-addr=10.1.2.3", "s.py"]),
    (
        {},
        [
            "--nnodes=1:4",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=h:5",
            "--rdzv-id=j",
            "--rdzv-conf=join_timeout=5, last_call_timeout = 1 ,timeout=7",
            "--node-rank=2",
            "s.py",
        ],
    ),
    ({}, ["--rdzv-backend=c10d", "s.py"]),
    ({}, ["--rdzv-backend=static", "--rdzv-endpoint=[::1]:29501", "s.py"]),
    ({}, ["--nproc-per-node=4", "-r", "0:3,1:2,7:1", "-t", "2", "--local-ranks-filter=0, 2", "s.py"]),
    ({}, ["--log-dir=LOGDIR", "--duplicate-stdout-filters=a,,b", "--logs-specs=default", "s.py"]),
    ({}, ["--log-dir=/dev/null", "--numa-binding=node", "--event-log-handler=console", "s.py"]),
    (
        {},
        [
            "--max-restarts=2",
            "--monitor-interval=0.25",
            "--start-method=fork",
            "--role=r",
            "--local-addr=10.0.0.9",
            "s.py",
        ],
    ),
    (
        {},
        ["--signals-to-handle=SIGTERM, SIGUSR1,NOPE", "--shutdown-timeout=0", "--virtual-local-rank", "s.py"],
    ),
    (
        {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]"},
        ["s.py"],
    ),
    ({"PYTHON_EXEC": "/usr/bin/python3"}, ["s.py", "a"]),
    ({"PYTHON_EXEC": "/usr/bin/python3"}, ["-m", "mod"]),
    ({}, ["--no-python", "/bin/echo", "hi"]),
    ({}, ["--run-path", "--no-python", "-m", "/abs/s.py", "q"]),
    ({"PET_MODULE": "0", "PET_NO_PYTHON": "1"}, ["/bin/true"]),
    ({"PET_NNODES": "1:1", "PET_NPROC_PER_NODE": "2", "PET_STANDALONE": "1", "PET_ROLE": "pet"}, ["s.py"]),
    ({}, ["--rdzv-id=", "--master-port=1", "s.py"]),
    ({}, ["--rdzv-conf=timeout=5,rank=9", "--master-port=29500", "--node-rank=0", "s.py"]),
    ({"OMP_NUM_THREADS": "7"}, ["--nproc-per-node=2", "s.py"]),
]


@pytest.mark.parametrize("env,argv", CONFIG_CASES, ids=lambda x: repr(x))
def test_config_matches_torchrun(
    env: dict[str, str],
    argv: list[str],
    clean_env: pytest.MonkeyPatch,
    torchrun: Any,
    tmp_path: Path,
) -> None:
    from torch.distributed.elastic.multiprocessing.api import to_map
    from torch.distributed.launcher.api import _get_entrypoint_name

    argv = [a.replace("LOGDIR", str(tmp_path / "logs")) for a in argv]
    for key, value in env.items():
        clean_env.setenv(key, value)
    ours = parse_args(argv)
    # parse_args leaves the environment alone; torchrun's config step may not.
    assert ("OMP_NUM_THREADS" in os.environ) == ("OMP_NUM_THREADS" in env)
    got = _torchrun_config(torchrun, argv, clean_env, tmp_path)
    theirs = got.config

    assert (ours.min_nodes, ours.max_nodes) == (theirs.min_nodes, theirs.max_nodes)
    assert ours.nproc_per_node == theirs.nproc_per_node
    assert ours.rdzv_backend == theirs.rdzv_backend
    assert ours.rdzv_endpoint == theirs.rdzv_endpoint
    assert ours.rdzv_configs == theirs.rdzv_configs
    if _is_uuid4(theirs.run_id):
        assert _is_uuid4(ours.rdzv_id) and ours.rdzv_id != theirs.run_id
        assert ours.standalone or ours.auto_standalone
    elif theirs.run_id:
        assert ours.rdzv_id == theirs.run_id
    else:  # torchrun replaces an empty id later, in launch_agent, with uuid4().int
        assert ours.rdzv_id.isdigit() and any("run_id" in n for n in ours.notices)
    for name in (
        "max_restarts",
        "monitor_interval",
        "start_method",
        "role",
        "local_addr",
        "event_log_handler",
        "signals_to_handle",
        "virtual_local_rank",
        "shutdown_timeout",
        "log_line_prefix_template",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert list(ours.duplicate_stdout_filters) == theirs.duplicate_stdout_filters
    assert list(ours.duplicate_stderr_filters) == theirs.duplicate_stderr_filters

    specs = theirs.logs_specs
    nproc = theirs.nproc_per_node
    assert {k: int(v) for k, v in ours.redirects.items()} == {
        k: int(v) for k, v in to_map(specs._redirects, nproc).items()
    }
    assert {k: int(v) for k, v in ours.tee.items()} == {
        k: int(v) for k, v in to_map(specs._tee, nproc).items()
    }
    assert ours.local_ranks_filter == specs._local_ranks_filter
    if ours.log_dir is not None:
        assert ours.log_dir == specs._root_log_dir
    numa = None if theirs.numa_options is None else theirs.numa_options.affinity_mode.value
    assert ours.numa_binding == numa

    command = build_worker_command(ours)
    if callable(got.entrypoint):
        assert command.kind is EntryKind.RUN_PATH
        assert list(got.args) == [ours.training_script, *ours.training_script_args]
    else:
        assert command.subprocess_argv == (got.entrypoint, *got.args)
        assert command.binary == got.entrypoint
    assert command.summary_name == _get_entrypoint_name(got.entrypoint, list(got.args))


# Bad values torchrun rejects while building its config, in the same process.
# Several entries have more than one mistake: the first one reported must match.
CONFIG_ERROR_CASES: list[tuple[dict[str, str], list[str]]] = [
    ({}, ["--nnodes=1:2:3", "s.py"]),
    ({}, ["--nnodes=2:1", "s.py"]),
    ({}, ["--nnodes=0", "s.py"]),
    ({}, ["--nnodes=x", "s.py"]),
    ({}, ["--nnodes=1:y", "--rdzv-backend=c10d", "s.py"]),
    ({}, ["--max-restarts=-1", "s.py"]),
    ({}, ["--nproc-per-node=foo", "s.py"]),
    ({}, ["--nproc-per-node=3.0", "s.py"]),
    ({}, ["--nproc-per-node=xpu", "s.py"]),
    ({}, ["--rdzv-conf=a", "s.py"]),
    ({}, ["--rdzv-conf==1", "s.py"]),
    ({}, ["--rdzv-conf=a=1,b= ", "s.py"]),
    ({}, ["--local-ranks-filter=a,b", "s.py"]),
    ({}, ["--local-ranks-filter=0,,1", "s.py"]),
    ({}, ["--logs-specs=DOESNOT_EXIST", "s.py"]),
    ({}, ["-r", "5", "s.py"]),
    ({}, ["-r", "11", "s.py"]),
    ({}, ["-t", "0:1,", "s.py"]),
    ({}, ["-t", "0:1,1", "s.py"]),
    ({}, ["-r", "1,0:1", "s.py"]),
    ({}, ["--log-dir=AFILE", "s.py"]),
    ({}, ["--shutdown-timeout=-1", "s.py"]),
    ({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"}, ["s.py"]),
    ({}, ["--no-python", "-m", "s.py"]),
    ({"PET_MODULE": "1", "PET_NO_PYTHON": "1"}, ["s.py"]),
    ({}, ["--nnodes=2:1", "--max-restarts=-1", "--nproc-per-node=foo", "-r", "9", "s.py"]),
    ({}, ["--max-restarts=-1", "--nproc-per-node=foo", "s.py"]),
    ({}, ["--nproc-per-node=foo", "--rdzv-conf=x", "s.py"]),
    ({}, ["--rdzv-conf=x", "--local-ranks-filter=q", "s.py"]),
    ({}, ["--local-ranks-filter=q", "--logs-specs=zz", "s.py"]),
    ({}, ["--logs-specs=zz", "-r", "7", "s.py"]),
    ({}, ["-r", "7", "-t", "8", "s.py"]),
    ({}, ["-t", "8", "--log-dir=AFILE", "s.py"]),
    ({}, ["--log-dir=AFILE", "--shutdown-timeout=-2", "s.py"]),
    ({}, ["--shutdown-timeout=-2", "--no-python", "-m", "s.py"]),
]


@pytest.mark.parametrize("env,argv", CONFIG_ERROR_CASES, ids=lambda x: repr(x))
def test_config_errors_match_torchrun(
    env: dict[str, str],
    argv: list[str],
    clean_env: pytest.MonkeyPatch,
    torchrun: Any,
    tmp_path: Path,
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    argv = [a.replace("AFILE", str(afile)) for a in argv]
    for key, value in env.items():
        clean_env.setenv(key, value)
    with pytest.raises(Exception) as theirs:
        _torchrun_config(torchrun, argv, clean_env, tmp_path)
    with pytest.raises(LaunchConfigError) as ours:
        parse_args(argv)
    assert ours.value.torchrun_error == type(theirs.value).__name__
    assert str(ours.value) == str(theirs.value)


def test_gpu_without_cuda_fails_like_torchrun(
    clean_env: pytest.MonkeyPatch, torchrun: Any, tmp_path: Path
) -> None:
    import torch

    if torch.cuda.is_available() or cuda_device_count() > 0:
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="Cuda is not available."):
        _torchrun_config(torchrun, ["--nproc-per-node=gpu", "s.py"], clean_env, tmp_path)
    with pytest.raises(LaunchConfigError, match="Cuda is not available."):
        parse_args(["--nproc-per-node=gpu", "s.py"])


def test_cpu_and_auto_counts_match_torch(clean_env: pytest.MonkeyPatch, torchrun: Any) -> None:
    import torch

    assert resolve_nproc_per_node("cpu") == torch._utils.cpu_count()
    if not torch.accelerator.is_available() and cuda_device_count() == 0:
        assert resolve_nproc_per_node("auto") == torch._utils.cpu_count()
    elif torch.cuda.is_available():
        assert resolve_nproc_per_node("gpu") == torch.cuda.device_count()


# Errors torchrun only reports once it starts the agent (rendezvous handler,
# WorkerSpec). They cannot be provoked without running torchrun, so run the
# real CLI (all cases at once, it takes ~2 s of import each) and compare.
LATE_ERROR_CASES: list[list[str]] = [
    ["--nproc-per-node=0", "s.py"],
    ["--nproc-per-node=-2", "--master-port=PORT", "s.py"],
    ["--monitor-interval=0", "s.py"],
    ["--rdzv-backend=bogus", "--rdzv-endpoint=localhost:0", "s.py"],
    ["--master-port=70000", "s.py"],
    ["--master-addr=", "--master-port=PORT", "s.py"],
    ["--master-addr=bad host", "--master-port=PORT", "s.py"],
    ["--master-port=PORT", "--rdzv-conf=timeout=abc", "s.py"],
    ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-conf=read_timeout=0", "s.py"],
    ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-conf=is_host=maybe", "s.py"],
    ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-conf=store_type=redis", "s.py"],
    ["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:99999", "s.py"],
    ["--standalone", "--rdzv-conf=join_timeout=0,last_call_timeout=x", "s.py"],
    ["--standalone", "--rdzv-conf=close_timeout=-5", "s.py"],
    ["--standalone", "--rdzv-conf=keep_alive_interval=z", "s.py"],
    ["--no-python", "--master-port=PORT", ""],
]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Imports torchrun once, then forks one real torchrun per case (argv lists, JSON) from itself:
#: each child runs torchrun's console script, ``sys.exit(main())``, with its own argv and its
#: output in <dir>/case<i>.out and .err, without paying for an ``import torch`` of its own
#: (seconds each, 16 times). Prints the children's exit codes, in order, as JSON.
TORCHRUN_FORKS = """
import json, os, sys
from torch.distributed.run import main

torchrun, out_dir, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
children = {}
for i, argv in enumerate(cases):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, kind in ((1, "out"), (2, "err")):
            path = os.path.join(out_dir, f"case{i}.{kind}")
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.argv = [torchrun, *argv]
        sys.exit(main())
    children[pid] = i
codes = [None] * len(cases)
while children:
    pid, status = os.wait()
    codes[children.pop(pid)] = os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""


def _last_exception_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception)\b", line):
            return line
    raise AssertionError(f"no exception line in:\n{stderr}")


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_late_errors_match_real_torchrun(tmp_path: Path, torchrun: Any) -> None:
    torchrun_bin = Path(sys.executable).with_name("torchrun")
    if not torchrun_bin.exists():
        pytest.skip("no torchrun next to the interpreter")
    (tmp_path / "s.py").write_text("raise SystemExit(0)\n")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    cases = []
    for argv in LATE_ERROR_CASES:
        argv = [a.replace("PORT", str(_free_port())) for a in argv]
        cases.append(argv)
    argvs = [["--log-dir", str(tmp_path / "logs"), *argv] for argv in cases]
    template = _popen(
        [sys.executable, "-c", TORCHRUN_FORKS, str(torchrun_bin), str(tmp_path), json.dumps(argvs)],
        env,
        tmp_path,
    )
    try:
        out, err = template.communicate(timeout=150)
    finally:
        if template.poll() is None:
            os.killpg(template.pid, 9)
            template.wait()
    assert template.returncode == 0, (out, err)
    for i, (argv, code) in enumerate(zip(cases, json.loads(out), strict=True)):
        err = (tmp_path / f"case{i}.err").read_text()
        assert code == 1, (argv, err)
        theirs = _last_exception_line(err)
        with pytest.raises(LaunchConfigError) as ours:
            parse_args(["--log-dir", str(tmp_path / "logs"), *argv], environ=env)
        kind, _, message = theirs.partition(": ")
        assert ours.value.torchrun_error == kind.rsplit(".", 1)[-1], (argv, theirs)
        if message:  # torchrun's bare AssertionError has none; ours explains
            assert str(ours.value) == message, argv


def test_preload_takes_module_names_for_python_workers() -> None:
    config = parse_args(["--preload", "torch, numpy.linalg", "s.py"], environ={})
    assert config.preload == ("torch", "numpy.linalg")
    assert parse_args(["s.py"], environ={"PET_PRELOAD": "torch"}).preload == ("torch",)
    assert parse_args(["s.py"], environ={}).preload == ()
    with pytest.raises(LaunchConfigError, match="--preload takes module names, got 'to rch'") as err:
        parse_args(["--preload", "to rch", "s.py"], environ={})
    assert err.value.torchrun_error is None and err.value.hint
    with pytest.raises(LaunchConfigError, match="--no-python"):
        parse_args(["--preload", "torch", "--no-python", "echo"], environ={})


def test_etcd_backends_are_refused() -> None:
    for backend in ("etcd", "etcd-v2"):
        with pytest.raises(LaunchConfigError) as err:
            parse_args([f"--rdzv-backend={backend}", "--rdzv-endpoint=h:2379", "s.py"], environ={})
        assert err.value.torchrun_error is None and err.value.hint


# ---------------------------------------------------------------------------
# behaviour documented in the spec (no torch needed)
# ---------------------------------------------------------------------------


def test_launcher_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from monarch._src.launch import cli, command, config, worker_env\n"
        "c = cli.parse_args(['--nproc-per-node=auto', 's.py'])\n"
        "command.build_worker_command(c)\n"
        "worker_env.worker_env_vars(c, 0, master_addr='h', master_port=1, error_file='')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_defaults_single_node() -> None:
    c = parse_args(["train.py", "--lr", "1"], environ={})
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node) == (1, 1, 1)
    assert c.auto_standalone and not c.standalone
    assert (c.rdzv_backend, c.rdzv_endpoint, c.rdzv_host, c.rdzv_port) == (
        "c10d",
        "localhost:0",
        "localhost",
        0,
    )
    assert _is_uuid4(c.rdzv_id)
    assert c.rdzv_configs == {"timeout": 900}
    assert c.master_port == 29500 and c.master_addr == "127.0.0.1"
    assert c.shutdown_timeout == 30 and c.kill_grace_period == 30.0
    assert c.redirects == {0: Std.NONE} and c.tee == {0: Std.NONE}
    assert c.local_ranks_filter is None and c.log_dir is None
    assert c.training_script_args == ("--lr", "1")
    assert c.notices == ()


def test_master_port_keeps_static() -> None:
    c = parse_args(["--master-port=29511", "--nproc-per-node=2", "s.py"], environ={})
    assert (c.rdzv_backend, c.rdzv_endpoint, c.rdzv_id) == ("static", "127.0.0.1:29511", "none")
    assert c.rdzv_configs == {"rank": 0, "timeout": 900}
    assert (c.rdzv_host, c.rdzv_port) == ("127.0.0.1", 29511)


def test_c10d_default_port_and_notices() -> None:
    c = parse_args(
        ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0", "--node-rank=1", "s.py"], environ={}
    )
    assert (c.rdzv_host, c.rdzv_port) == ("node0", 29400)
    assert any("node_rank is only used" in n for n in c.notices)
    c = parse_args(["--rdzv-backend=c10d", "--signals-to-handle=SIGTERM,SIGKILL,FOO", "s.py"], environ={})
    assert any("master_addr is only used" in n for n in c.notices)
    assert sum("Failed to register signal handler" in n for n in c.notices) == 2
    import signal

    assert c.resolved_signals() == (signal.SIGTERM,)


def test_std_forms_from_spec() -> None:
    assert parse_std("0") is Std.NONE and parse_std("3") is Std.ALL
    assert parse_std("0:1,1:1") == {0: Std.OUT, 1: Std.OUT}
    for bad in ("0:1,", "11", "0:1,1", "1,0:1", "4", "10:1"):
        with pytest.raises(LaunchConfigError):
            parse_std(bad)
    assert std_to_map({1: Std.OUT}, 2) == {0: Std.NONE, 1: Std.OUT}
    c = parse_args(["--nproc-per-node=2", "-r", "0:2", "-t", "1:1", "s.py"], environ={})
    assert c.file_streams(0) is Std.ERR and c.file_streams(1) is Std.OUT


def test_local_ranks_filter_is_a_set() -> None:
    c = parse_args(["--local-ranks-filter=0,2,2", "--nproc-per-node=3", "s.py"], environ={})
    assert c.local_ranks_filter == frozenset({0, 2})
    assert c.console_visible(0) and not c.console_visible(1)


def test_cuda_visible_devices_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_physical_cuda_devices", lambda: ["GPU-aaa", "GPU-bbb", "GPU-ccc"])
    cases = {
        None: 3,
        "": 0,
        "-1": 0,
        "0,1": 2,
        "2,0": 2,
        "1,7,0": 1,
        "0,0": 1,
        "GPU-b": 1,
        "GPU-b,GPU-a,2": 3,
        "GPU-zz,0": 0,
        "junk": 0,
    }
    for visible, expected in cases.items():
        env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
        assert cuda_device_count(env) == expected, visible
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    assert resolve_nproc_per_node("gpu", env) == 1 and resolve_nproc_per_node("auto", env) == 1
    monkeypatch.setattr(cli, "_physical_cuda_devices", lambda: [])
    with pytest.raises(LaunchConfigError, match="Cuda is not available"):
        resolve_nproc_per_node("gpu", {})
    assert resolve_nproc_per_node("auto", {}) == cli.cpu_count()


def test_parse_args_or_exit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args_or_exit(["--nnodes=1:2:3", "s.py"], environ={})
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert 'RuntimeError: nnodes=1:2:3 is not in "MIN:MAX" format' in err
    assert "HINT:" in err
    with pytest.raises(SystemExit) as exc:
        parse_args_or_exit(["--nproc=2", "s.py"], environ={})
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        parse_args_or_exit(["s.py"], environ={"PET_STANDALONE": "yes"})
    assert exc.value.code == 1


def test_config_error_pickles() -> None:
    err = LaunchConfigError("m", torchrun_error="AssertionError", hint="h")
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.torchrun_error, back.hint) == ("m", "AssertionError", "h")
    assert isinstance(back, ValueError)


def test_config_is_frozen_and_picklable() -> None:
    c = parse_args(["--nproc-per-node=2", "-t", "3", "s.py"], environ={})
    with pytest.raises(AttributeError):
        c.nproc_per_node = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(c)) == c
    assert isinstance(c, LaunchConfig)


def test_parse_does_not_touch_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    parse_args(["--nproc-per-node=4", "s.py"])
    assert dict(os.environ) == before


def test_namespace_can_be_validated_separately() -> None:
    ns = build_parser({}).parse_args(["--nnodes=3", "--master-addr=h", "s.py"])
    c = config_from_namespace(ns, {})
    assert (c.rdzv_backend, c.rdzv_endpoint, c.max_nodes) == ("static", "h:29500", 3)
