"""Helpers shared by bench_monarch_api.py and bench_ray.py.

Standard library only: this module is imported by benchmark scripts running
under three different virtual environments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

MiB = 1024 * 1024
PAYLOAD_BYTES = 64 * MiB
NUMPY_ELEMS = 16 * MiB  # float32 -> 64 MiB

ALL_METRICS = [
    "import_s",
    "idle_worker_rss_mb",
    "spawn_s",
    "rt_sync_us",
    "rt_await_us",
    "outstanding_calls_per_s",
    "gather_per_s",
    "payload_bytes_mb_per_s",
    "payload_numpy_mb_per_s",
    "inproc_rt_us",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5, help="measured rounds per metric")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured warmup rounds")
    p.add_argument("--out", default=None, help="write the JSON result here (rewritten after every metric)")
    p.add_argument("--metrics", default=None, help="comma-separated subset of metrics")
    p.add_argument("--budget", type=float, default=20.0, help="soft per-metric time budget in seconds")
    p.add_argument(
        "--metric-timeout",
        type=float,
        default=90.0,
        help="hard per-metric limit: past it the metric is recorded as hung and the "
        "process exits with code 3 (run_all.py then runs the remaining metrics)",
    )
    p.add_argument(
        "--loop-s",
        type=float,
        default=1.0,
        help="max seconds of one round of a call loop (round trip, gather)",
    )
    return p.parse_args(argv)


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def import_time_samples(module_stmt: str, n: int) -> list[float]:
    """Wall time of `python -c <import>` minus `python -c pass`, n paired samples.

    Runs in an empty temp dir so the project checkout (which has its own
    `monarch/` folder) can never shadow the interpreter's installed package.
    """
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # Measure a warm import as a user sees it: bytecode caching on. Caches go to
    # PYTHONPYCACHEPREFIX (run_all.py points it under benchmarks/out/) or a temp
    # dir, so nothing is written into the source tree.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out: list[float] = []
    with tempfile.TemporaryDirectory() as cwd:
        env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(cwd, "pycache"))

        def t(code: str) -> float:
            s = time.perf_counter()
            r = subprocess.run(
                [sys.executable, "-c", code],
                cwd=cwd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            dt = time.perf_counter() - s
            if r.returncode != 0:
                err = r.stderr.decode(errors="replace").strip().splitlines()
                raise RuntimeError(
                    f"`python -c {code!r}` exited {r.returncode}: " + (err[-1] if err else "(no stderr)")
                )
            return dt

        t("pass")
        t(module_stmt)  # warm the page cache / bytecode cache
        for _ in range(n):
            base = t("pass")
            full = t(module_stmt)
            out.append(max(0.0, full - base))
    return out


class Recorder:
    """Collects per-round samples and writes {medians, samples, errors} as JSON."""

    def __init__(self, impl: str, args: argparse.Namespace, extra: dict[str, Any]):
        self.args = args
        self.result: dict[str, Any] = {
            "impl": impl,
            "python": sys.version.split()[0],
            "rounds": args.rounds,
            "metrics": {},
            "samples": {},
            "errors": {},
            "done": False,
            **extra,
        }
        wanted = args.metrics.split(",") if args.metrics else ALL_METRICS
        self.wanted = [m for m in wanted if m]

    def want(self, metric: str) -> bool:
        return metric in self.wanted

    def set(self, metric: str, samples: list[float | None]) -> None:
        vals = [s for s in samples if s is not None]
        self.result["samples"][metric] = vals
        self.result["metrics"][metric] = statistics.median(vals) if vals else None
        self.flush()

    def null(self, metric: str, why: str) -> None:
        self.result["samples"][metric] = []
        self.result["metrics"][metric] = None
        self.result.setdefault("notes", {})[metric] = why
        self.flush()

    def error(self, metric: str, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}"
        self.result["errors"][metric] = msg[:500]
        self.result["metrics"].setdefault(metric, None)
        print(f"[bench] {metric} failed: {msg}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        self.flush()

    def run(self, metric: str, fn: Callable[[], None]) -> None:
        if not self.want(metric):
            return
        print(f"[bench] {metric} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        with self.guard(metric, [metric]):
            try:
                fn()
            except BaseException as e:
                if isinstance(e, KeyboardInterrupt):
                    raise
                self.error(metric, e)
        print(
            f"[bench] {metric} took {time.perf_counter() - t0:.1f}s -> {self.result['metrics'].get(metric)}",
            file=sys.stderr,
            flush=True,
        )

    @contextlib.contextmanager
    def guard(self, label: str, metrics: list[str]):
        """Watchdog for a metric (`run`) or a step between metrics (mesh setup/teardown): on a
        hang, the given metrics are recorded as hung and the process exits with code 3."""

        def hung() -> None:
            for m in metrics:
                if self.want(m):
                    self.result["errors"][m] = f"hung in {label} after {self.args.metric_timeout:.0f}s"
                    self.result["metrics"].setdefault(m, None)
            self.result["hung"] = label
            print(
                f"[bench] {label} HUNG after {self.args.metric_timeout:.0f}s; exiting",
                file=sys.stderr,
                flush=True,
            )
            try:
                self.flush()
            finally:
                os._exit(3)

        t = threading.Timer(self.args.metric_timeout, hung)
        t.daemon = True
        t.start()
        try:
            yield
        finally:
            t.cancel()

    def flush(self) -> None:
        if self.args.out:
            tmp = self.args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.result, f, indent=1)
            os.replace(tmp, self.args.out)

    def finish(self) -> None:
        self.result["done"] = True
        self.flush()
        sys.stdout.write(json.dumps(self.result) + "\n")
        sys.stdout.flush()


def rounds(args: argparse.Namespace, budget: float | None = None):
    """Yield (is_warmup, index) for warmup + measured rounds, stopping early past the budget
    (always at least one measured round)."""
    budget = args.budget if budget is None else budget
    start = time.perf_counter()
    total = args.warmup + args.rounds
    measured = 0
    for i in range(total):
        warm = i < args.warmup
        if measured >= 1 and time.perf_counter() - start > budget:
            return
        yield warm, i
        if not warm:
            measured += 1


def sample_rounds(args: argparse.Namespace, sample: Callable[[], float]) -> list[float]:
    """Call sample() once per round of `rounds(args)`; return the measured ones (warm-up values dropped)."""
    out: list[float] = []
    for warm, _ in rounds(args):
        x = sample()
        if not warm:
            out.append(x)
    return out


def timed_loop(fn: Callable[[int], Any], max_n: int, max_s: float) -> float:
    """Run fn(i) up to max_n times or max_s seconds; return seconds per call."""
    n = 0
    s = time.perf_counter()
    while n < max_n:
        fn(n)
        n += 1
        if (n & 15) == 0 and time.perf_counter() - s > max_s:
            break
    return (time.perf_counter() - s) / n


async def timed_loop_async(fn: Callable[[int], Awaitable[Any]], max_n: int, max_s: float) -> float:
    """`timed_loop` for an awaitable: await fn(i) up to max_n times or max_s seconds; return seconds
    per call."""
    n = 0
    s = time.perf_counter()
    while n < max_n:
        await fn(n)
        n += 1
        if (n & 15) == 0 and time.perf_counter() - s > max_s:
            break
    return (time.perf_counter() - s) / n
