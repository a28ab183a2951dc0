"""Side by side: the same scripts and flags under the real ``torchrun`` and ``python -m monarch.launch``.

Compared: the workers' environments (all of it, minus what is random by design: ports of
ephemeral rendezvous, uuid run ids, temporary directories), exit codes, the failure
summary, restart counts seen by the workers, the log directory layout, the console tee
prefixes, and the final loss of a small DDP training (gloo, 2 ranks, fixed seed), which
must be identical even when our run restarts after a crash.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from launch_helpers import REPO, TORCHRUN, Run, clean_env, free_port, monarch_launch, run_cmd, torchrun

pytest.importorskip("torch")
#: Every test here runs real torchrun and the launcher side by side: all are slow.
pytestmark = [pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed"), pytest.mark.slow]

ENV_AND_OUTPUT = """
import json, os, sys
rank = os.environ["RANK"]
with open(os.path.join(sys.argv[1], "rank" + rank + ".json"), "w") as fp:
    json.dump({"env": dict(os.environ), "argv": sys.argv[1:], "name": __name__}, fp)
print(f"out-line1 from rank{rank}")
print(f"err-line1 from rank{rank}", file=sys.stderr)
print(f"out-line2 from rank{rank}")
"""

_LOG_LINE = re.compile(r"^[DIWEC]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ \S+:\d+\] ")


def _worker_lines(text: str) -> list[str]:
    """What the workers printed (the launchers' own log lines removed), in sorted order."""
    return sorted(line for line in text.splitlines() if line.strip() and not _LOG_LINE.match(line))


def _tree(root: Path) -> list[str]:
    (run_dir,) = root.iterdir()
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))


def _run_both(
    tmp_path: Path, scripts, name: str, body: str, flags: list[str], *extra: str, timeout: float = 90
):
    script = scripts.write(name, body)
    results: dict[str, tuple[Run, Path, Path]] = {}
    for who, launch in (("torchrun", torchrun), ("monarch", monarch_launch)):
        out, logs = tmp_path / who / "out", tmp_path / who / "logs"
        out.mkdir(parents=True)
        flags_here = [f.replace("{LOGS}", str(logs)) for f in flags]
        run = launch(*flags_here, script, str(out), *extra, env=clean_env(), timeout=timeout)
        results[who] = (run, out, logs)
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rdzv", ["static", "c10d-standalone"])
def test_worker_environment_logs_and_prefixes_match(tmp_path, scripts, rdzv):
    flags = ["--nproc-per-node=2", "--log-dir", "{LOGS}", "-t", "3"]
    if rdzv == "static":
        flags.append(f"--master-port={free_port()}")
    res = _run_both(tmp_path, scripts, "env.py", ENV_AND_OUTPUT, flags)
    (rt, out_t, logs_t), (rm, out_m, logs_m) = res["torchrun"], res["monarch"]
    assert rt.rc == rm.rc == 0, (rt, rm)

    random_by_design = {"TORCHELASTIC_ERROR_FILE"}
    if rdzv != "static":
        random_by_design |= {"MASTER_PORT", "TORCHELASTIC_RUN_ID"}
    for rank in (0, 1):
        t = json.loads((out_t / f"rank{rank}.json").read_text())
        m = json.loads((out_m / f"rank{rank}.json").read_text())
        assert m["argv"] == [str(out_m)] and t["argv"] == [str(out_t)]
        assert m["name"] == t["name"] == "__main__"
        te, me = t["env"], m["env"]
        assert sorted(me) == sorted(te)
        differing = sorted(k for k in te if te[k] != me[k] and k not in random_by_design)
        assert differing == [], {k: (te[k], me[k]) for k in differing}
        # The error file sits at the same place of the same layout.
        tail = lambda p: Path(p).parts[-3:]  # noqa: E731
        assert (
            tail(me["TORCHELASTIC_ERROR_FILE"])
            == tail(te["TORCHELASTIC_ERROR_FILE"])
            == ("attempt_0", str(rank), "error.json")
        )
        run_t, run_m = (
            Path(te["TORCHELASTIC_ERROR_FILE"]).parts[-4],
            Path(me["TORCHELASTIC_ERROR_FILE"]).parts[-4],
        )
        for run_dir, run_id in ((run_m, me["TORCHELASTIC_RUN_ID"]), (run_t, te["TORCHELASTIC_RUN_ID"])):
            assert run_dir.startswith(run_id + "_") and len(run_dir) == len(run_id) + 9  # <run_id>_<rand8>
    if rdzv == "static":
        assert (
            me["MASTER_PORT"] == te["MASTER_PORT"]
            and me["TORCHELASTIC_RUN_ID"] == te["TORCHELASTIC_RUN_ID"] == "none"
        )

    assert _tree(logs_m) == _tree(logs_t)
    assert _worker_lines(rm.out) == _worker_lines(rt.out)
    assert _worker_lines(rm.err) == _worker_lines(rt.err)
    assert "[default1]:out-line2 from rank1" in _worker_lines(rm.out)


FAILING_WITH_RECORD = """
import os, sys, time
rank, sync = int(os.environ["RANK"]), sys.argv[1]
if rank != 1:
    open(os.path.join(sync, f"ready{rank}"), "w").close()
    time.sleep(60)
from torch.distributed.elastic.multiprocessing.errors import record
while len([n for n in os.listdir(sync) if n.startswith("ready")]) < int(os.environ["WORLD_SIZE"]) - 1:
    time.sleep(0.01)

@record
def main():
    raise ValueError("boom from rank 1")

main()
"""

_BLOCK = re.compile(
    r"\[(\d+)\]:\n  time      : \S+\n  host      : (.+)\n  rank      : (\d+) \(local_rank: (\d+)\)\n"
    r"  exitcode  : (-?\d+) \(pid: \d+\) (.*)\n  error_file: (.+)\n  traceback : (.*(?:\n  .*)*)"
)


def _summary(err: str) -> tuple[str, list[tuple[str, ...]], str]:
    text = err[err.index("=" * 60) :]
    title = text.split("\n")[1]
    blocks = []
    for idx, host, rank, local, code, sig, efile, tb in _BLOCK.findall(text):
        last = [line for line in tb.split("\n") if line.strip()][-1].strip()
        last = re.sub(r"PID \d+", "PID <pid>", last)
        efile = "<N/A>" if efile == "<N/A>" else "/".join(Path(efile).parts[-3:])
        blocks.append((idx, host, rank, local, code, sig, efile, last))
    root = text[text.index("Root Cause") :].split("\n")[1]
    return title, blocks, root


@pytest.mark.timeout(120)
def test_failure_exit_code_and_summary_match(tmp_path, scripts):
    res = _run_both(
        tmp_path, scripts, "failing.py", FAILING_WITH_RECORD, ["--nproc-per-node=3", "--log-dir", "{LOGS}"]
    )
    (rt, _, _), (rm, _, _) = res["torchrun"], res["monarch"]
    assert rt.rc == rm.rc == 1, (rt, rm)
    title_t, blocks_t, root_t = _summary(rt.err)
    title_m, blocks_m, root_m = _summary(rm.err)
    assert title_m.replace(str(tmp_path / "monarch"), "") == title_t.replace(str(tmp_path / "torchrun"), "")
    assert blocks_m == blocks_t
    assert root_m == root_t == "[0]:"
    root_block = [b for b in blocks_m if b[0] == "0"][0]
    assert root_block[2:5] == ("1", "1", "1") and root_block[6] == "attempt_0/1/error.json"
    assert root_block[7] == "ValueError: boom from rank 1"
    assert {b[4] for b in blocks_m if b[0] != "0"} == {"-15"}  # the others were sent SIGTERM


FLAKY = """
import os, sys, time
count, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
out = sys.argv[1]
with open(os.path.join(out, f"rank{rank}-attempt{count}"), "w") as fp:
    fp.write(os.environ["TORCHELASTIC_MAX_RESTARTS"])
if rank == "1" and int(count) < 2:
    while not os.path.exists(os.path.join(out, f"rank0-attempt{count}")):
        time.sleep(0.01)
    sys.exit(1)
"""


@pytest.mark.timeout(120)
def test_restart_counts_and_attempt_dirs_match(tmp_path, scripts):
    res = _run_both(
        tmp_path,
        scripts,
        "flaky.py",
        FLAKY,
        ["--nproc-per-node=2", "--max-restarts=3", "--log-dir", "{LOGS}"],
    )
    (rt, out_t, logs_t), (rm, out_m, logs_m) = res["torchrun"], res["monarch"]
    assert rt.rc == rm.rc == 0, (rt, rm)
    seen_t = {p.name: p.read_text() for p in out_t.iterdir()}
    seen_m = {p.name: p.read_text() for p in out_m.iterdir()}
    assert seen_m == seen_t
    assert sorted(seen_m) == [f"rank{r}-attempt{a}" for r in (0, 1) for a in (0, 1, 2)]
    assert _tree(logs_m) == _tree(logs_t)


@pytest.mark.timeout(240)
def test_ddp_final_loss_matches_after_a_restart_and_as_an_actor_mesh(tmp_path, scripts):
    script = scripts.root / "train_ddp.py"
    shutil.copy(REPO / "examples" / "train_ddp.py", script)
    args = [str(script), "--epochs", "2", "--steps", "10"]
    rt = torchrun("--nproc-per-node=2", *args, timeout=150)
    if rt.rc != 0:
        # torch's gloo teardown now and then aborts a worker after training ended (SIGABRT,
        # seen under real torchrun in CI, twice in a row under load): the reference needs only
        # the final loss it printed, which the assertion on ``final_t`` below checks.
        assert "Signal 6 (SIGABRT)" in rt.err and "final loss" in rt.out, rt
    # Ours crashes rank 1 on the first attempt and restarts: a fresh rendezvous makes the
    # restart work (torchrun 2.13's stale store can hang there), and training from the
    # same seed gives the same loss.
    rm = monarch_launch(
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--kill-grace-period=5",
        *args,
        "--fail-rank",
        "1",
        "--fail-attempt",
        "0",
        timeout=150,
    )
    assert rm.rc == 0, rm
    final_t = re.findall(r"final loss (\S+) \(world size 2, attempt 0\)", rt.out)
    final_m = re.findall(r"final loss (\S+) \(world size 2, attempt 1\)", rm.out)
    assert final_t and final_m == final_t, (rt.out, rm.out)
    assert "RuntimeError: rank 1 fails on purpose (attempt 0)" in rm.err

    # The next step down the ladder, examples/ddp_actor_mesh.py: the same training as an
    # actor mesh whose controller catches rank 1's failure and restarts the group.
    actor = shutil.copy(REPO / "examples" / "ddp_actor_mesh.py", scripts.root / "ddp_actor_mesh.py")
    ra = run_cmd([sys.executable, str(actor), "--epochs", "2", "--steps", "10"], timeout=150)
    assert ra.rc == 0, ra
    assert "[controller] attempt 0 failed: RuntimeError: rank 1 fails on purpose (attempt 0)" in ra.out
    assert re.findall(r"final loss (\S+) \(world size 2, attempt 1\)", ra.out) == final_t
