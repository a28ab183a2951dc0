"""Where a message's time goes: cProfile of every thread that handles it, in both processes.

    .venv/bin/python benchmarks/profile_messaging.py [--workload rt_sync] [--n 5000] [--top 15] [--proc]

Workloads: ``rt_sync`` (``call_one().get()``), ``rt_await`` (``await call_one()`` on an async
endpoint, as ``bench_monarch_api.py`` measures it), ``gather``
(``call().get()`` on 4 processes), ``gather_await`` (``await call()`` on 4 processes), ``outstanding`` (10,000 ``call_one`` sent, then waited for),
``inproc`` and ``inproc_await`` (a sync actor of this process), ``inproc_async_await`` (an
async actor of this process, awaited from the main thread's loop), ``inproc_same_loop`` (an
async actor awaiting another one of its process: one loop, no thread between them). Profiles the caller's thread, the
client's loop thread and, in the worker, its loop thread and the actor's thread; prints each
one's top entries by own time (``tottime``) per call of the workload.

``--proc`` measures instead, without a profiler, what load does not inflate: each thread's CPU
time and voluntary context switches (wake-ups) per call, from ``/proc``, in the client and in
every worker, as medians of ``--reps`` runs of ``--n`` calls.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import marshal
import os
import pstats
import statistics
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from monarch._src.actor.process_state import runtime
from monarch.actor import Actor, endpoint, this_host, this_proc

_profiles: dict[str, cProfile.Profile] = {}


def _start(name: str) -> None:
    _profiles[name] = p = cProfile.Profile()
    p.enable()


def _stop(name: str) -> bytes:
    p = _profiles.pop(name)
    p.disable()
    p.create_stats()
    return marshal.dumps(p.stats)  # type: ignore[attr-defined]


class Echo(Actor):
    @endpoint
    def echo(self, x=None):
        return x

    @endpoint
    def threads(self) -> tuple[int, dict[int, str]]:
        """This process's pid and its threads' names by native id (for ``--proc``)."""
        return os.getpid(), _thread_names()

    @endpoint
    def prof(self, on: bool) -> bytes | None:
        """Profile the actor's thread."""
        if on:
            _start("actor")
            return None
        return _stop("actor")


class AsyncEcho(Actor):
    @endpoint
    async def echo(self, x=None):
        return x


class Driver(Actor):
    """Awaits an async actor of its own process from an endpoint (``inproc_same_loop``)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    @endpoint
    async def run(self, n: int) -> None:
        for i in range(n):
            await self.target.echo.call_one(i)


class LoopProf(Actor):
    @endpoint
    async def prof(self, on: bool) -> bytes | None:
        """Profile the worker's loop thread (async endpoints run on it)."""
        if on:
            _start("loop")
            return None
        return _stop("loop")


def _on_client_loop(fn, *args):
    rt = runtime()
    fut = asyncio.run_coroutine_threadsafe(_call(fn, *args), rt.loop)
    return fut.result(10)


async def _call(fn, *args):
    return fn(*args)


def _print(title: str, stats: bytes | dict, calls: int, top: int) -> None:
    out = io.StringIO()
    with tempfile.NamedTemporaryFile(suffix=".prof") as f:
        f.write(stats if isinstance(stats, bytes) else marshal.dumps(stats))
        f.flush()
        st = pstats.Stats(f.name, stream=out)
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    ncalls = sum(v[1] for v in st.stats.values())  # type: ignore[attr-defined]
    print(
        f"\n### {title}: {total / calls * 1e6:.1f} µs of profiled own time and "
        f"{ncalls / calls:.1f} function calls per call"
    )
    print("| own µs/call | calls/call | function |\n|---|---|---|")
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # type: ignore[attr-defined]
    for (file, line, fn), (_cc, nc, tt, _ct, _callers) in rows:
        where = file.split("/monarch/")[-1] if "/monarch/" in file else file.rsplit("/", 1)[-1]
        print(f"| {tt / calls * 1e6:.2f} | {nc / calls:.2f} | `{fn}` ({where}:{line}) |")


def _thread_names() -> dict[int, str]:
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def _proc_figures(pid: int) -> dict[int, tuple[float, int]]:
    """Each thread of ``pid``: (CPU seconds, voluntary context switches) so far."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu = int(f.read().split()[0]) / 1e9
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                vcs = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
        out[int(tid)] = (cpu, vcs)
    return out


def _measure(
    run: Callable[[int], None], n: int, reps: int, procs: dict[str, tuple[int, dict[int, str]]]
) -> None:
    """``--proc``: CPU µs and voluntary switches per call of each thread (medians of ``reps``)."""
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(reps):
        before = {who: _proc_figures(pid) for who, (pid, _) in procs.items()}
        run(n)
        for who, (pid, names) in procs.items():
            after = _proc_figures(pid)
            for tid, (cpu, vcs) in after.items():
                if tid in before[who]:
                    cpu0, vcs0 = before[who][tid]
                    key = (who, names.get(tid, f"thread {tid}"))
                    samples.setdefault(key, []).append(((cpu - cpu0) / n * 1e6, (vcs - vcs0) / n))
    print("| process | thread | CPU µs/call | voluntary switches/call |\n|---|---|---|---|")
    for (who, name), xs in sorted(samples.items()):
        cpu, vcs = statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)
        if cpu >= 0.05 or vcs >= 0.01:
            print(f"| {who} | {name} | {cpu:.1f} | {vcs:.2f} |")
    for who in procs:
        cpu = sum(statistics.median(x[0] for x in xs) for (w, _), xs in samples.items() if w == who)
        vcs = sum(statistics.median(x[1] for x in xs) for (w, _), xs in samples.items() if w == who)
        print(f"| {who} | all | {cpu:.1f} | {vcs:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--workload",
        default="rt_sync",
        choices=[
            "rt_sync",
            "rt_await",
            "gather",
            "gather_await",
            "outstanding",
            "inproc",
            "inproc_await",
            "inproc_async_await",
            "inproc_same_loop",
        ],
    )
    p.add_argument("--n", type=int, default=5000, help="calls profiled")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--proc", action="store_true", help="CPU and wake-ups per call from /proc, no profiler")
    p.add_argument("--reps", type=int, default=5, help="runs of --n calls measured with --proc")
    a = p.parse_args()
    w = a.workload
    inproc = w.startswith("inproc")
    procs = None
    if inproc:
        echo = this_proc().spawn("echo", Echo)
        loop_prof = None
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 4 if w.startswith("gather") else 1})
        echo = procs.spawn("echo", Echo)
        loop_prof = procs.spawn("loop_prof", LoopProf)
    spawner = this_proc() if inproc else procs
    target = (
        spawner.spawn("async_echo", AsyncEcho)
        if w in ("rt_await", "inproc_async_await", "inproc_same_loop")
        else echo
    )  # type: ignore[union-attr]
    driver = this_proc().spawn("driver", Driver, target) if w == "inproc_same_loop" else None
    target.echo.call(0).get()
    n = a.n if w != "outstanding" else max(1, a.n // 10_000) * 10_000

    def run(n: int) -> None:
        if w in ("rt_sync", "inproc"):
            for i in range(n):
                echo.echo.call_one(i).get()
        elif w in ("rt_await", "inproc_await", "inproc_async_await"):

            async def one_by_one() -> None:
                for i in range(n):
                    await target.echo.call_one(i)

            asyncio.run(one_by_one())
        elif w == "inproc_same_loop":
            driver.run.call_one(n).get()  # type: ignore[union-attr]
        elif w == "gather":
            for i in range(n):
                echo.echo.call(i).get()
        elif w == "gather_await":

            async def gather() -> None:
                for i in range(n):
                    await echo.echo.call(i)

            asyncio.run(gather())
        else:
            for _ in range(n // 10_000):
                futs = [echo.echo.call_one(i) for i in range(10_000)]
                for f in futs:
                    f.get()

    if a.proc:
        run(min(n, 500))  # warm: connections made, reply addresses lent
        watched = {"client": (os.getpid(), _thread_names())}
        if procs is not None:
            for rank, (pid, names) in enumerate(echo.threads.call().get().values()):
                watched[f"worker {rank}"] = (pid, names)
        _measure(run, n, a.reps, watched)
        if procs is not None:
            procs.stop().get()
        return

    echo.prof.call(True).get()
    if loop_prof is not None:
        loop_prof.prof.call(True).get()
    _on_client_loop(_start, "client loop")
    _start("caller")
    run(n)
    caller = _stop("caller")
    client_loop = _on_client_loop(_stop, "client loop")
    _print("client: caller's thread", caller, n, a.top)
    _print("client: loop thread", client_loop, n, a.top)
    actor = echo.prof.call(False).get().values()[0]
    _print(f"{'client' if inproc else 'worker(s)'}: actor thread", actor, n, a.top)
    if loop_prof is not None:
        _print("worker(s): loop thread", loop_prof.prof.call(False).get().values()[0], n, a.top)
    if procs is not None:
        procs.stop().get()


if __name__ == "__main__":
    main()
