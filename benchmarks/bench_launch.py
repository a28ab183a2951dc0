"""Launcher wall time: ``python -m monarch.launch`` vs ``torchrun``, same scripts, same run.

Two workloads, each with 2 and 4 ranks, run to completion:

* ``print``: a script that prints its rank (launcher overhead only);
* ``gloo``: a script that imports torch, calls ``init_process_group("gloo")``, a barrier,
  and ``destroy_process_group()`` (what a real training script pays before step one).

Runs are interleaved (torchrun, monarch, torchrun, monarch ...) after one warm-up of each,
so both see the same machine load; the table shows medians, the ratio monarch/torchrun,
and whether the target (at most half of torchrun's wall time) is met. ``monarch.launch`` is
the default, which for ``gloo`` forks the workers from one template that imported torch once
(the script imports torch first: ``--preload`` decides it is safe); for ``gloo`` a third
launcher runs in the same rotation: ``monarch.launch --preload none`` (each worker imports
torch itself).

    .venv/bin/python benchmarks/bench_launch.py                      # 5 rounds
    .venv/bin/python benchmarks/bench_launch.py --rounds 3 --results benchmarks/RESULTS.md

``--results FILE`` writes the table as the ``## Launcher`` section of FILE (replacing an
earlier ``## Launcher`` section, leaving every other section alone).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PRINT_RANK = "import os\nprint('rank', os.environ['RANK'], flush=True)\n"
GLOO = (
    "import os\n"
    "import torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "dist.barrier()\n"
    "dist.destroy_process_group()\n"
    "print('rank', os.environ['RANK'], 'initialized', flush=True)\n"
)
WORKLOADS = {"print": PRINT_RANK, "gloo": GLOO}
IMPORTS_TORCH = {"gloo"}
NO_PRELOAD = "monarch.launch --preload none"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.pop("OMP_NUM_THREADS", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _once(argv: list[str], expect: int, timeout: float) -> float:
    start = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=timeout)
    elapsed = time.perf_counter() - start
    lines = r.stdout.count("rank")  # torchrun's workers share one fd: lines can interleave mid-line
    if r.returncode != 0 or lines != expect:
        raise RuntimeError(
            f"{argv} failed (rc {r.returncode}, {lines}/{expect} ranks):\n{r.stdout}\n{r.stderr}"
        )
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per case (after one warm-up)")
    p.add_argument("--nprocs", default="2,4", help="rank counts, comma-separated")
    p.add_argument("--workloads", default="print,gloo")
    p.add_argument("--timeout", type=float, default=180.0, help="per launch")
    p.add_argument(
        "--results", default=None, help="write the table as the '## Launcher' section of this file"
    )
    args = p.parse_args()

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        sys.exit("torchrun not found (install torch into this venv)")
    monarch = [sys.executable, "-m", "monarch.launch"]
    launchers = {"torchrun": [torchrun], "monarch.launch": monarch}
    preloading = {**launchers, NO_PRELOAD: [*monarch, "--preload", "none"]}
    nprocs = [int(n) for n in args.nprocs.split(",")]
    workloads = args.workloads.split(",")

    tmp = Path(tempfile.mkdtemp(prefix="bench_launch_"))
    rows = []
    try:
        for name in workloads:
            script = tmp / f"{name}.py"
            script.write_text(WORKLOADS[name])
            for n in nprocs:
                these = preloading if name in IMPORTS_TORCH else launchers
                times: dict[str, list[float]] = {k: [] for k in these}
                for round_ in range(args.rounds + 1):
                    for who, cmd in these.items():
                        t = _once([*cmd, f"--nproc-per-node={n}", str(script)], n, args.timeout)
                        if round_ > 0:
                            times[who].append(t)
                med = {k: statistics.median(v) for k, v in times.items()}
                ratio = med["monarch.launch"] / med["torchrun"]
                rows.append((name, n, med["torchrun"], med["monarch.launch"], ratio, times))
                print(
                    f"{name:5s} nproc={n}: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()), flush=True
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    cmd = "python benchmarks/bench_launch.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "## Launcher",
        "",
        f"`{cmd.strip()}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, CPython "
        f"{platform.python_version()}, 1-min load {load:.1f} at the end; medians of {args.rounds} "
        "interleaved runs after one warm-up each).",
        "Wall time of one launch to completion, from starting the launcher to its exit. `print`: "
        'each rank prints its rank. `gloo`: each rank imports torch, `init_process_group("gloo")`, '
        "barrier, `destroy_process_group()`. Target: monarch.launch at most half of torchrun. "
        "monarch.launch's default preloads torch for `gloo` (the script imports torch first).",
        "",
        f"| workload | ranks | torchrun s | monarch.launch s | ratio | target (<= 0.5) | `{NO_PRELOAD}` s | ratio | runs (torchrun / monarch / no preload) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, n, t_med, m_med, ratio, times in rows:
        runs = " / ".join(" ".join(f"{x:.2f}" for x in xs) for xs in times.values())
        pre = times.get(NO_PRELOAD)
        pre_cells = f"{statistics.median(pre):.2f} | {statistics.median(pre) / t_med:.2f}" if pre else "— | —"
        lines.append(
            f"| {name} | {n} | {t_med:.2f} | {m_med:.2f} | {ratio:.2f} | {'met' if ratio <= 0.5 else 'missed'} "
            f"| {pre_cells} | {runs} |"
        )
    table = "\n".join(lines) + "\n"
    print()
    print(table)
    if args.results:
        path = Path(args.results)
        text = path.read_text() if path.exists() else ""
        pattern = re.compile(r"^## Launcher\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
        if pattern.search(text):
            text = pattern.sub(lambda _: table + "\n", text, count=1)
        else:
            text = text.rstrip("\n") + ("\n\n" if text else "") + table
        path.write_text(text)


if __name__ == "__main__":
    main()
