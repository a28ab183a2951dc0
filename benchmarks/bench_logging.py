"""Log forwarding throughput: 4 worker procs each print 100,000 short lines as fast as they can.

For each mode a fresh client process spawns the workers, starts the flood on all of them at
once, and waits for a flush barrier (every line read by the spawner and delivered to the
client's stdout, or to its aggregator and then written). It reports

* lines/s delivered: lines accounted for on the client's stdout (an aggregated summary
  ``[N similar log lines] ...`` counts N) divided by the time from the start of the flood to
  the end of the barrier;
* client CPU: user + system CPU seconds the client process used in that interval (its
  spawner reader, aggregator and writer threads are all in it), also as a share of one core.

Modes: ``stream+aggregate`` (``logging_option(stream_to_client=True, aggregate_window_sec=3)``),
``stream`` (window None: every line is written), ``default`` (not streamed: the spawner writes
the lines directly). The client's stdout goes to a counting sink, not a terminal.

Run: .venv/bin/python benchmarks/bench_logging.py [--procs 4] [--lines 100000] [--rounds 3]
     [--results benchmarks/RESULTS.md]   (appends a "Logging" section)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

CLIENT = r'''
import asyncio, io, json, re, resource, sys, time
from monarch.actor import Actor, endpoint, this_host
from monarch._src.host.spawner import flush_worker_output

MODE, PROCS, LINES = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SUMMARY = re.compile(r"^\[(\d+) similar log lines\] ", re.M)


class Sink(io.TextIOBase):
    """Counts the lines written to it (a summary line counts as the lines it stands for)."""

    def __init__(self):
        self.lines = 0

    def write(self, s):
        n = s.count("\n")
        for m in SUMMARY.finditer(s):
            n += int(m.group(1)) - 1
        self.lines += n
        return len(s)

    def flush(self):
        pass


class Flood(Actor):
    @endpoint
    def flood(self, n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            print(f"step {i} loss={i * 0.001:.3f}")
        return time.perf_counter() - start


real_stdout = sys.stdout
procs = this_host().spawn_procs(per_host={"gpus": PROCS})
flood = procs.spawn("flood", Flood)
flood.flood.call(1).get()  # warm: processes up, actor constructed
if MODE == "stream+aggregate":
    asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=3))
elif MODE == "stream":
    asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=None))
flush_worker_output(timeout=30)
sys.stdout = sink = Sink()

r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
worker_s = flood.flood.call(LINES).get(timeout=600).values()
t_printed = time.perf_counter()
flush_worker_output(timeout=600)
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
sys.stdout = real_stdout

cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({
    "mode": MODE, "procs": PROCS, "lines_each": LINES,
    "delivered": sink.lines, "expected": PROCS * LINES,
    "wall_s": t1 - t0, "print_wall_s": t_printed - t0, "worker_print_s": max(worker_s),
    "lines_per_s": sink.lines / (t1 - t0), "client_cpu_s": cpu, "client_cpu_share": cpu / (t1 - t0),
}))
'''

MODES = ["stream+aggregate", "stream", "default"]


def run_one(mode: str, procs: int, lines: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, mode, str(procs), str(lines)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd="/tmp",
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed (rc={out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--results", default=None, help="append a 'Logging' section to this markdown file")
    args = p.parse_args()
    modes = args.modes.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):  # interleaved, so drift hits every mode alike
        for mode in modes:
            r = run_one(mode, args.procs, args.lines)
            runs[mode].append(r)
            print(json.dumps(r), file=sys.stderr)
    rows = []
    for mode in modes:
        rs = runs[mode]

        def med(k: str, rs: list = rs) -> float:
            return statistics.median(r[k] for r in rs)

        rows.append(
            f"| {mode} | {med('lines_per_s'):,.0f} | {med('wall_s'):.2f} | {med('worker_print_s'):.2f} | "
            f"{med('client_cpu_s'):.2f} | {100 * med('client_cpu_share'):.0f}% | "
            f"{min(r['delivered'] for r in rs):,} / {rs[0]['expected']:,} |"
        )
    header = (
        "| mode | lines/s delivered | wall s | worker print s (slowest) | client CPU s | client CPU (% of a core) | lines delivered (min) |\n"
        "|---|---|---|---|---|---|---|"
    )
    table = header + "\n" + "\n".join(rows)
    print(table)
    if args.results:
        cmd = (
            "python benchmarks/bench_logging.py "
            + " ".join(
                f"--{k} {v}"
                for k, v in (("procs", args.procs), ("lines", args.lines), ("rounds", args.rounds))
            )
            + f" --results {args.results}"
        )
        cpu = f"{os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}"
        section = (
            f"\n## Logging\n\n"
            f"`{cmd}` ({time.strftime('%Y-%m-%d')}, {cpu}; medians of {args.rounds} interleaved runs).\n"
            f"{args.procs} worker procs each print {args.lines:,} short lines (`step <i> loss=<x>`) as fast as "
            f"they can; timed from the start of the flood until a flush barrier saw every line delivered "
            f"to the client's stdout (a counting sink). Client CPU is the whole client process "
            f"(spawner pipe readers, aggregator, writer threads). The workers and the client share "
            f"the machine's CPUs (1-min load average {load:.1f} at the start), so delivery is bounded by "
            f"how fast the workers can print; aggregation costs the client about 1 us per line.\n\n{table}\n"
        )
        with open(args.results, "a") as f:
            f.write(section)


if __name__ == "__main__":
    main()
