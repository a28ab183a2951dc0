"""Benchmark written only against the public Monarch actor API.

Runs unchanged under monarch-aio (the checkout's .venv) and Meta's torchmonarch
(.venvs/torchmonarch): both import as `monarch`.

    python benchmarks/bench_monarch_api.py [--rounds 5] [--warmup 1] [--out FILE]

Prints ONE JSON object as the last line of stdout (and writes it to --out,
rewritten after each metric so a timeout still leaves partial results).
Run it from a directory that has no `monarch/` folder (run_all.py does).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu

_t0 = time.perf_counter()
import monarch  # noqa: E402
from monarch.actor import Actor, endpoint, this_host, this_proc  # noqa: E402

_in_process_import_s = time.perf_counter() - _t0

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None


# torchmonarch 0.7 rejects classes that mix sync and async endpoints, so the
# sync and async echo servers are two classes.
class Echo(Actor):
    @endpoint
    def echo(self, x=None):
        return x

    @endpoint
    def nbytes(self, x):
        n = getattr(x, "nbytes", None)
        return int(n) if n is not None else len(x)

    @endpoint
    def pid(self):
        return os.getpid()


class AsyncEcho(Actor):
    @endpoint
    async def echo(self, x=None):
        return x


def _monarch_origin() -> str:
    f = getattr(monarch, "__file__", None)
    if f:
        return os.path.dirname(os.path.abspath(f))
    p = list(getattr(monarch, "__path__", []))
    return p[0] if p else "?"


def _impl_name() -> str:
    try:
        import importlib.metadata as md

        for dist in ("monarch-aio", "torchmonarch"):
            try:
                return f"{dist}=={md.version(dist)}"
            except md.PackageNotFoundError:
                pass
    except Exception:
        pass
    return "monarch(?)"


def spawn_mesh(n: int, name: str, cls=Echo):
    procs = this_host().spawn_procs(per_host={"gpus": n})
    return procs, procs.spawn(name, cls)


def main() -> None:
    args = bu.parse_args()
    rec = bu.Recorder(
        _impl_name(), args, {"monarch_path": _monarch_origin(), "in_process_import_s": _in_process_import_s}
    )
    R = args.rounds

    # g. import time -------------------------------------------------------
    def m_import():
        rec.set("import_s", bu.import_time_samples("import monarch.actor", max(R, 5)))

    rec.run("import_s", m_import)

    # h. idle worker RSS ---------------------------------------------------
    def m_rss():
        procs, a = spawn_mesh(1, "rss")
        try:
            pid = a.pid.call_one().get()
            time.sleep(1.0)  # let the worker settle / go idle
            rec.set("idle_worker_rss_mb", [bu.rss_mb(pid)])
            rec.result["worker_pid_seen"] = pid
        finally:
            procs.stop().get()

    rec.run("idle_worker_rss_mb", m_rss)

    # a. spawn: 4 procs + actor mesh + first reply --------------------------
    def m_spawn():
        def one() -> float:
            t = time.perf_counter()
            procs = this_host().spawn_procs(per_host={"gpus": 4})
            echo = procs.spawn("x", Echo)
            echo.echo.call().get()
            dt = time.perf_counter() - t
            procs.stop().get()
            return dt

        rec.set("spawn_s", bu.sample_rounds(args, one))

    rec.run("spawn_s", m_spawn)

    # b/c/e. one 1-proc mesh hosting a sync and an async echo actor ---------
    need_one = any(
        rec.want(m)
        for m in (
            "rt_sync_us",
            "rt_await_us",
            "outstanding_calls_per_s",
            "payload_bytes_mb_per_s",
            "payload_numpy_mb_per_s",
        )
    )
    one_metrics = [
        "rt_sync_us",
        "rt_await_us",
        "outstanding_calls_per_s",
        "payload_bytes_mb_per_s",
        "payload_numpy_mb_per_s",
    ]
    procs1 = None
    try:
        if need_one:
            with rec.guard("1-proc mesh setup", one_metrics):
                procs1 = this_host().spawn_procs(per_host={"gpus": 1})
                sync_a = procs1.spawn("sync_echo", Echo)
                async_a = procs1.spawn("async_echo", AsyncEcho)
                sync_a.echo.call_one(0).get()
                async_a.echo.call_one(0).get()
    except BaseException as e:
        for m in one_metrics:
            if rec.want(m):
                rec.error(m, e)
        need_one = False

    if need_one:
        # b. round trip, sync .get()
        def m_rt_sync():
            rec.set(
                "rt_sync_us",
                bu.sample_rounds(
                    args,
                    lambda: bu.timed_loop(lambda i: sync_a.echo.call_one(i).get(), 2000, args.loop_s) * 1e6,
                ),
            )

        rec.run("rt_sync_us", m_rt_sync)

        # b. round trip, await inside asyncio.run
        def m_rt_await():
            rec.set(
                "rt_await_us",
                bu.sample_rounds(
                    args,
                    lambda: (
                        asyncio.run(
                            bu.timed_loop_async(lambda i: async_a.echo.call_one(i), 2000, args.loop_s)
                        )
                        * 1e6
                    ),
                ),
            )

        rec.run("rt_await_us", m_rt_await)

        # c. 10,000 outstanding call_one, then wait all
        def m_outstanding():
            N = 10_000

            def one() -> float:
                t = time.perf_counter()
                futs = [sync_a.echo.call_one(i) for i in range(N)]
                for f in futs:
                    f.get()
                return N / (time.perf_counter() - t)

            rec.set("outstanding_calls_per_s", bu.sample_rounds(args, one))

        rec.run("outstanding_calls_per_s", m_outstanding)

        # e. 64 MiB payloads
        def m_payload_bytes():
            data = os.urandom(bu.PAYLOAD_BYTES)

            def one() -> float:
                t = time.perf_counter()
                n = sync_a.nbytes.call_one(data).get()
                dt = time.perf_counter() - t
                assert n == bu.PAYLOAD_BYTES, n
                return bu.PAYLOAD_BYTES / 1e6 / dt

            rec.set("payload_bytes_mb_per_s", bu.sample_rounds(args, one))

        rec.run("payload_bytes_mb_per_s", m_payload_bytes)

        def m_payload_numpy():
            if np is None:
                raise RuntimeError("numpy not installed")
            arr = np.random.default_rng(0).random(bu.NUMPY_ELEMS, dtype=np.float32)

            def one() -> float:
                t = time.perf_counter()
                n = sync_a.nbytes.call_one(arr).get()
                dt = time.perf_counter() - t
                assert n == arr.nbytes, n
                return arr.nbytes / 1e6 / dt

            rec.set("payload_numpy_mb_per_s", bu.sample_rounds(args, one))

        rec.run("payload_numpy_mb_per_s", m_payload_numpy)

    if procs1 is not None:
        try:
            with rec.guard("1-proc mesh stop", []):
                procs1.stop().get()
        except BaseException as e:
            print(f"[bench] stopping 1-proc mesh failed: {e!r}", file=sys.stderr)

    # d. gather on a 4-proc actor mesh -------------------------------------
    def m_gather():
        procs, a = spawn_mesh(4, "gather")
        try:
            a.echo.call(0).get()
            rec.set(
                "gather_per_s",
                bu.sample_rounds(
                    args, lambda: 1.0 / bu.timed_loop(lambda i: a.echo.call(i).get(), 2000, args.loop_s)
                ),
            )
        finally:
            procs.stop().get()

    rec.run("gather_per_s", m_gather)

    # f. in-process actor --------------------------------------------------
    def m_inproc():
        a = this_proc().spawn("inproc_echo", Echo)
        a.echo.call_one(0).get()
        rec.set(
            "inproc_rt_us",
            bu.sample_rounds(
                args, lambda: bu.timed_loop(lambda i: a.echo.call_one(i).get(), 2000, args.loop_s) * 1e6
            ),
        )

    rec.run("inproc_rt_us", m_inproc)

    rec.finish()


if __name__ == "__main__":
    main()
