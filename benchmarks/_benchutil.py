"""The benchmark itself: its table of metrics and the loop that runs them; bench_monarch_api.py
and bench_ray.py are small adapters (`Impl`) that say how to spawn and call actors.

Standard library only: this module is imported by benchmark scripts running
under three different virtual environments, and by run_all.py (any python3).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

MiB = 1024 * 1024
PAYLOAD_BYTES = 64 * MiB
NUMPY_ELEMS = 16 * MiB  # float32 -> 64 MiB
#: Ray's node: CPUs and object store of bench_ray.py's one-node cluster and of the head of
#: run_all.py's two-node one (``--netns``).
RAY_NUM_CPUS = 4
RAY_OBJECT_STORE_BYTES = 1 << 30
#: The custom resource (`ray start --resources`) of the Ray node that ``--peer-host`` puts the
#: peer on: Ray places actors by resources, not by address.
RAY_PEER_RESOURCE = "bench_peer_host"


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
        "--transport",
        default=None,
        help="what the processes talk over, as monarch.actor.enable_transport names it (tcp: "
        "loopback TCP); default: the implementation's own (monarch: Unix sockets; Ray: TCP)",
    )
    p.add_argument(
        "--peer-host",
        default=None,
        help="put the peer (the one-process target of the point-to-point metrics) on another "
        "host (monarch: the agent at `tcp://HOST:PORT`, `run_worker_loop_forever` or `python -m "
        "monarch.host`; Ray: the node offering the resource RAY_PEER_RESOURCE of the running "
        "cluster whose head is at `HOST:PORT`, this host being the head's); default: this host",
    )
    p.add_argument(
        "--client-loop",
        choices=["asyncio", "uvloop"],
        default=None,
        help="the event loop the benchmark's coroutines await on (default: asyncio's own; "
        "bench_floor.py: uvloop)",
    )
    p.add_argument(
        "--loop-s",
        type=float,
        default=1.0,
        help="max seconds of one round of a call loop (round trip, gather)",
    )
    return p.parse_args(argv)


def run_coroutine(args: argparse.Namespace, coro: Awaitable[Any]) -> Any:
    """Run ``coro`` to completion on a new event loop of the kind ``--client-loop`` names."""
    if args.client_loop == "uvloop":
        import uvloop

        return uvloop.run(coro)  # type: ignore[arg-type]
    return asyncio.run(coro)  # type: ignore[arg-type]


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
            "transport": args.transport or "default",
            "client_loop": args.client_loop or "asyncio",
            "metrics": {},
            "samples": {},
            "errors": {},
            "done": False,
            **extra,
        }
        wanted = args.metrics.split(",") if args.metrics else [m.key for m in METRICS]
        self.wanted = [m for m in wanted if m]

    def want(self, metric: str) -> bool:
        return metric in self.wanted

    def set(self, metric: str, samples: Sequence[float | None]) -> None:
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

    def run(self, metric: str, measure: Callable[[], Sequence[float | None]]) -> None:
        """Record ``measure()``'s samples as ``metric`` (an exception as its error), under the watchdog."""
        if not self.want(metric):
            return
        print(f"[bench] {metric} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        with self.guard(metric, [metric]):
            try:
                self.set(metric, measure())
            except NotMeasured as e:
                self.null(metric, str(e))
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


class NotMeasured(Exception):
    """Raised by an adapter for a metric its implementation has no counterpart for: the metric
    is recorded as null with this reason, not as an error."""


class Mesh(Protocol):
    """``n`` worker processes with one echo actor each."""

    def echo_all(self, x: Any) -> None:
        """Echo ``x`` on every actor; return once all replied."""

    def echo_all_async(self, x: Any) -> Awaitable[Any]:
        """``echo_all`` as something to await (all the replies, gathered)."""

    def worker_pid(self) -> int:
        """The pid of the worker process of a one-process mesh."""

    def stop(self) -> None:
        """Stop the actors and their processes."""


class Peer(Protocol):
    """One worker process hosting a sync and an async echo actor, already warmed up: the target
    of the point-to-point metrics."""

    def echo(self, x: Any) -> Any:
        """Round trip to the sync actor, blocking."""

    def echo_async(self, x: Any) -> Awaitable[Any]:
        """Round trip to the async actor, as something to await."""

    def nbytes(self, x: Any) -> int:
        """Send ``x`` to the sync actor; it answers with its size."""

    def echo_many(self, n: int) -> None:
        """Send ``n`` echoes to the sync actor before waiting for any, then wait for all."""

    def stop(self) -> None:
        """Stop the actors and their process."""


class Impl(Protocol):
    """What one implementation provides; every metric is written against this alone."""

    #: Recorded as the result's ``impl`` (name and version).
    name: str
    #: What ``import_s`` times in a fresh interpreter.
    import_statement: str
    #: More fields for the result (where the implementation was imported from, ...).
    extra: dict[str, Any]

    def start(self, transport: str | None, peer_host: str | None) -> None:
        """Start the runtime, on ``transport`` if given (see ``--transport``), before the first
        metric that spawns anything; attach to ``peer_host`` if given (see ``--peer-host``)."""

    def spawn(self, n: int) -> Mesh: ...

    def spawn_peer(self) -> Peer: ...

    def inproc_echo(self) -> Callable[[Any], Any]:
        """A blocking round trip to an actor in this process (raise NotMeasured where none)."""

    def inproc_echo_async(self) -> Callable[[Any], Awaitable[Any]]:
        """The same round trip as ``inproc_echo``, as something to await from a coroutine."""

    def shutdown(self) -> None:
        """Undo ``start``, after the result is printed."""


@dataclass
class Run:
    """What a metric's measurement gets: the implementation, the arguments, the recorder (for
    extra result fields) and, for ``on_peer`` metrics, the peer."""

    impl: Impl
    args: argparse.Namespace
    rec: Recorder
    peer: Peer | None = None


def _import_s(r: Run) -> list[float]:
    return import_time_samples(r.impl.import_statement, max(r.args.rounds, 5))


def _idle_worker_rss_mb(r: Run) -> list[float | None]:
    mesh = r.impl.spawn(1)
    try:
        pid = mesh.worker_pid()
        time.sleep(1.0)  # let the worker settle / go idle
        r.rec.result["worker_pid_seen"] = pid
        return [rss_mb(pid)]
    finally:
        mesh.stop()


def _spawn_s(r: Run) -> list[float]:
    def one() -> float:
        t = time.perf_counter()
        mesh = r.impl.spawn(4)
        mesh.echo_all(None)
        dt = time.perf_counter() - t
        mesh.stop()
        return dt

    return sample_rounds(r.args, one)


def _rt_sync_us(r: Run) -> list[float]:
    assert r.peer is not None
    echo = r.peer.echo
    return sample_rounds(r.args, lambda: timed_loop(echo, 2000, r.args.loop_s) * 1e6)


def _rt_await_us(r: Run) -> list[float]:
    assert r.peer is not None
    echo = r.peer.echo_async
    return sample_rounds(
        r.args, lambda: run_coroutine(r.args, timed_loop_async(echo, 2000, r.args.loop_s)) * 1e6
    )


def _outstanding_calls_per_s(r: Run) -> list[float]:
    assert r.peer is not None
    peer, n = r.peer, 10_000

    def one() -> float:
        t = time.perf_counter()
        peer.echo_many(n)
        return n / (time.perf_counter() - t)

    return sample_rounds(r.args, one)


def _payload_mb_per_s(r: Run, payload: Any, nbytes: int) -> list[float]:
    assert r.peer is not None
    peer = r.peer

    def one() -> float:
        t = time.perf_counter()
        n = peer.nbytes(payload)
        dt = time.perf_counter() - t
        assert n == nbytes, n
        return nbytes / 1e6 / dt

    return sample_rounds(r.args, one)


def _payload_bytes_mb_per_s(r: Run) -> list[float]:
    return _payload_mb_per_s(r, os.urandom(PAYLOAD_BYTES), PAYLOAD_BYTES)


def _payload_numpy_mb_per_s(r: Run) -> list[float]:
    try:
        import numpy as np
    except ImportError:
        raise RuntimeError("numpy not installed") from None
    arr = np.random.default_rng(0).random(NUMPY_ELEMS, dtype=np.float32)
    return _payload_mb_per_s(r, arr, arr.nbytes)


def _gather_per_s(r: Run) -> list[float]:
    mesh = r.impl.spawn(4)
    try:
        mesh.echo_all(0)
        return sample_rounds(r.args, lambda: 1.0 / timed_loop(mesh.echo_all, 2000, r.args.loop_s))
    finally:
        mesh.stop()


def _gather_await_per_s(r: Run) -> list[float]:
    mesh = r.impl.spawn(4)
    try:
        mesh.echo_all(0)
        echo = mesh.echo_all_async
        return sample_rounds(
            r.args, lambda: 1.0 / run_coroutine(r.args, timed_loop_async(echo, 2000, r.args.loop_s))
        )
    finally:
        mesh.stop()


def _inproc_rt_us(r: Run) -> list[float]:
    echo = r.impl.inproc_echo()
    return sample_rounds(r.args, lambda: timed_loop(echo, 2000, r.args.loop_s) * 1e6)


def _inproc_rt_await_us(r: Run) -> list[float]:
    echo = r.impl.inproc_echo_async()
    return sample_rounds(
        r.args, lambda: run_coroutine(r.args, timed_loop_async(echo, 2000, r.args.loop_s)) * 1e6
    )


@dataclass(frozen=True)
class Metric:
    key: str
    #: Row label, unit and number format of run_all.py's table.
    label: str
    unit: str
    fmt: str
    higher_is_better: bool
    measure: Callable[[Run], Sequence[float | None]]
    #: Measured on the shared `Peer` (set up before the first such metric, stopped after the last).
    on_peer: bool = False
    #: Needs no runtime: measured in fresh interpreters, before `Impl.start`.
    standalone: bool = False


#: Every metric, in the order they run.
METRICS = [
    Metric(
        "import_s", "import monarch.actor (ray: import ray)", "s", "{:.3f}", False, _import_s, standalone=True
    ),
    Metric("idle_worker_rss_mb", "idle worker RSS", "MB", "{:.1f}", False, _idle_worker_rss_mb),
    Metric("spawn_s", "spawn 4 procs + actor + 1st reply", "s", "{:.3f}", False, _spawn_s),
    Metric("rt_sync_us", "round trip call_one().get()", "µs", "{:,.0f}", False, _rt_sync_us, on_peer=True),
    Metric("rt_await_us", "round trip await call_one()", "µs", "{:,.0f}", False, _rt_await_us, on_peer=True),
    Metric(
        "outstanding_calls_per_s",
        "10k outstanding call_one",
        "calls/s",
        "{:,.0f}",
        True,
        _outstanding_calls_per_s,
        on_peer=True,
    ),
    Metric(
        "payload_bytes_mb_per_s",
        "64 MiB bytes payload",
        "MB/s",
        "{:,.0f}",
        True,
        _payload_bytes_mb_per_s,
        on_peer=True,
    ),
    Metric(
        "payload_numpy_mb_per_s",
        "64 MiB numpy payload",
        "MB/s",
        "{:,.0f}",
        True,
        _payload_numpy_mb_per_s,
        on_peer=True,
    ),
    Metric("gather_per_s", "call() on 4-proc mesh + get()", "gathers/s", "{:,.0f}", True, _gather_per_s),
    Metric(
        "gather_await_per_s",
        "await call() on 4-proc mesh",
        "gathers/s",
        "{:,.0f}",
        True,
        _gather_await_per_s,
    ),
    Metric("inproc_rt_us", "in-process actor round trip .get()", "µs", "{:,.1f}", False, _inproc_rt_us),
    Metric(
        "inproc_rt_await_us",
        "in-process actor round trip, await",
        "µs",
        "{:,.1f}",
        False,
        _inproc_rt_await_us,
    ),
]


def run_benchmark(impl: Impl) -> None:
    """Measure the metrics asked for on the command line and print the result (one JSON line)."""
    args = parse_args()
    rec = Recorder(impl.name, args, impl.extra)
    r = Run(impl, args, rec)
    peer_metrics = [m.key for m in METRICS if m.on_peer and rec.want(m.key)]
    started = peer_failed = False
    for m in METRICS:
        if not rec.want(m.key):
            continue
        if not m.standalone and not started:
            impl.start(args.transport, args.peer_host)
            started = True
        if m.on_peer and r.peer is None and not peer_failed:
            try:
                with rec.guard("1-proc mesh setup", peer_metrics):
                    r.peer = impl.spawn_peer()
            except BaseException as e:
                for key in peer_metrics:
                    rec.error(key, e)
                peer_failed = True
        if m.on_peer and peer_failed:
            continue
        rec.run(m.key, functools.partial(m.measure, r))
        if r.peer is not None and m.key == peer_metrics[-1]:
            try:
                with rec.guard("1-proc mesh stop", []):
                    r.peer.stop()
            except BaseException as e:
                print(f"[bench] stopping 1-proc mesh failed: {e!r}", file=sys.stderr)
            r.peer = None
    rec.finish()
    if started:
        impl.shutdown()
