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

``--netns`` measures the multi-node case instead: 2 nodes x ``--nprocs`` ranks, each node a
network namespace of its own (``tests/netns.py``, root only), one launcher per namespace with
the c10d store on node 0's address, as ``tests/launch/test_multinode_netns.py`` runs them; a
launch's time is from starting both launchers to the exit of the later one. Its section is
``## Launcher, 2 nodes over network namespaces``.

    .venv/bin/python benchmarks/bench_launch.py --netns --nprocs 2 --workloads gloo --rounds 3
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
RDZV_PORT = 29400  # each namespace has its own network stack, so the default port is free in it

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


def _once_on_nodes(cluster, argv: list[str], expect: int, timeout: float) -> float:
    """One launcher per host of ``cluster`` (``--nnodes`` of them), rendezvous at host 0; the
    wall time until the last launcher exits."""
    h0 = cluster.hosts[0].address
    start = time.perf_counter()
    procs = [
        cluster.popen(
            i,
            [
                *argv[:-1],
                f"--nnodes={len(cluster.hosts)}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={h0}:{RDZV_PORT}",
                "--rdzv-id=bench",
                f"--local-addr={host.address}",
                # torchrun hosts the store only where the endpoint matches the hostname (not an
                # address of a namespace) or is_host says so.
                f"--rdzv-conf=is_host={int(i == 0)}",
                argv[-1],
            ],
            # gloo finds its address from the hostname, which names no namespace's address:
            # pin it to the namespace's interface, as on a machine with several.
            env={**_env(), "GLOO_SOCKET_IFNAME": "eth0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, host in enumerate(cluster.hosts)
    ]
    outputs = [proc.communicate(timeout=timeout) for proc in procs]
    elapsed = time.perf_counter() - start
    lines = sum(out.count("rank") for out, _ in outputs)
    if any(proc.returncode != 0 for proc in procs) or lines != expect:
        raise RuntimeError(
            f"{argv} on {len(procs)} nodes failed (rc {[p.returncode for p in procs]}, {lines}/{expect} "
            f"ranks):\n" + "\n".join(out + err for out, err in outputs)
        )
    return elapsed


def _write_section(path: Path, table: str) -> None:
    """Put ``table`` (starting with its ``## `` title line) into ``path`` in place of the section
    of that title, or at its end."""
    title = table.split("\n", 1)[0]
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(rf"^{re.escape(title)}\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: table + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + table
    path.write_text(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per case (after one warm-up)")
    p.add_argument("--nprocs", default="2,4", help="rank counts, comma-separated")
    p.add_argument("--workloads", default="print,gloo")
    p.add_argument("--timeout", type=float, default=180.0, help="per launch")
    p.add_argument(
        "--results", default=None, help="write the table as the '## Launcher' section of this file"
    )
    p.add_argument(
        "--netns", action="store_true", help="2 nodes, each in a network namespace of its own (root only)"
    )
    args = p.parse_args()
    nodes = 2 if args.netns else 1

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
    cluster = _cluster(nodes)
    try:
        for name in workloads:
            script = tmp / f"{name}.py"
            script.write_text(WORKLOADS[name])
            for n in nprocs:
                these = preloading if name in IMPORTS_TORCH else launchers
                times: dict[str, list[float]] = {k: [] for k in these}
                for round_ in range(args.rounds + 1):
                    for who, cmd in these.items():
                        argv = [*cmd, f"--nproc-per-node={n}", str(script)]
                        if cluster is None:
                            t = _once(argv, n, args.timeout)
                        else:
                            t = _once_on_nodes(cluster, argv, nodes * n, args.timeout)
                        if round_ > 0:
                            times[who].append(t)
                med = {k: statistics.median(v) for k, v in times.items()}
                ratio = med["monarch.launch"] / med["torchrun"]
                rows.append((name, n, med["torchrun"], med["monarch.launch"], ratio, times))
                print(
                    f"{name:5s} {nodes}x{n}: " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items()),
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if cluster is not None:
            cluster.close()

    cmd = "python benchmarks/bench_launch.py " + " ".join(sys.argv[1:])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    title = "## Launcher, 2 nodes over network namespaces" if args.netns else "## Launcher"
    where = (
        "2 nodes (network namespaces on one bridge, this machine) x ranks per node; one launcher "
        "per node, c10d store on node 0's address; from starting both launchers to the later exit. "
        if args.netns
        else ""
    )
    lines = [
        title,
        "",
        f"`{cmd.strip()}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, CPython "
        f"{platform.python_version()}, 1-min load {load:.1f} at the end; medians of {args.rounds} "
        "interleaved runs after one warm-up each).",
        f"{where}Wall time of one launch to completion, from starting the launcher to its exit. `print`: "
        'each rank prints its rank. `gloo`: each rank imports torch, `init_process_group("gloo")`, '
        "barrier, `destroy_process_group()`. Target: monarch.launch at most half of torchrun. "
        "monarch.launch's default preloads torch for `gloo` (the script imports torch first).",
        "",
        f"| workload | ranks{' per node' if args.netns else ''} | torchrun s | monarch.launch s | ratio | target (<= 0.5) | `{NO_PRELOAD}` s | ratio | runs (torchrun / monarch / no preload) |",
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
        _write_section(Path(args.results), table)


def _cluster(nodes: int):
    """``nodes`` network namespaces (``tests/netns.py``), or None for one node (this host)."""
    if nodes == 1:
        return None
    sys.path.insert(0, str(REPO / "tests"))
    import netns

    reason = netns.unavailable_reason()
    if reason:
        sys.exit(f"--netns: {reason}")
    return netns.Cluster(nodes).__enter__()


if __name__ == "__main__":
    main()
