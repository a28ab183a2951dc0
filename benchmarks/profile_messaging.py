"""Where a message's time goes: cProfile of every thread that handles it, in both processes.

    .venv/bin/python benchmarks/profile_messaging.py [--workload rt_sync] [--n 5000] [--top 15]

Workloads: ``rt_sync`` (``call_one().get()``), ``rt_await`` (``await call_one()`` on an async
endpoint, as ``bench_monarch_api.py`` measures it), ``gather``
(``call().get()`` on 4 processes), ``gather_await`` (``await call()`` on 4 processes), ``outstanding`` (10,000 ``call_one`` sent, then waited for),
``inproc`` and ``inproc_await`` (an actor of this process). Profiles the caller's thread, the
client's loop thread and, in the worker, its loop thread and the actor's thread; prints each
one's top entries by own time (``tottime``) per call of the workload.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import marshal
import pstats
import tempfile

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--workload",
        default="rt_sync",
        choices=["rt_sync", "rt_await", "gather", "gather_await", "outstanding", "inproc", "inproc_await"],
    )
    p.add_argument("--n", type=int, default=5000, help="calls profiled")
    p.add_argument("--top", type=int, default=15)
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
    target = procs.spawn("async_echo", AsyncEcho) if w == "rt_await" else echo  # type: ignore[union-attr]
    target.echo.call(0).get()
    n = a.n if w != "outstanding" else max(1, a.n // 10_000) * 10_000

    echo.prof.call(True).get()
    if loop_prof is not None:
        loop_prof.prof.call(True).get()
    _on_client_loop(_start, "client loop")
    _start("caller")
    if w in ("rt_sync", "inproc"):
        for i in range(n):
            echo.echo.call_one(i).get()
    elif w in ("rt_await", "inproc_await"):

        async def run() -> None:
            for i in range(n):
                await target.echo.call_one(i)

        asyncio.run(run())
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
