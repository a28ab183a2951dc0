"""The bench_monarch_api.py measurements, done with Ray actors.

    python benchmarks/bench_ray.py [--rounds 5] [--warmup 1] [--out FILE]

Same JSON layout and metric keys as bench_monarch_api.py. Mapping:
  spawn     : 4 fresh actors (= 4 worker processes) + first reply from all, then ray.kill
  rt_*      : one actor, ray.get(a.echo.remote(i)) / `await a.echo.remote(i)` (async actor)
  outstanding: 10,000 .remote() refs, then ray.get(refs)
  gather    : ray.get([a.echo.remote() for a in 4 actors])
  payload   : bytes / numpy passed as an argument (Ray puts it in the object store)
  inproc_rt_us: null (Ray has no in-process actor)
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu
import numpy as np
import ray

NUM_CPUS = 4


@ray.remote(num_cpus=0)
class Echo:
    def echo(self, x=None):
        return x

    def nbytes(self, x):
        n = getattr(x, "nbytes", None)
        return int(n) if n is not None else len(x)

    def pid(self):
        return os.getpid()


@ray.remote(num_cpus=0)
class AsyncEcho:
    async def echo(self, x=None):
        return x


def _kill(actors):
    for a in actors:
        try:
            ray.kill(a)
        except Exception:
            pass


def main() -> None:
    args = bu.parse_args()
    rec = bu.Recorder(f"ray=={ray.__version__}", args, {})
    R = args.rounds

    def m_import():
        rec.set("import_s", bu.import_time_samples("import ray", max(R, 5)))

    rec.run("import_s", m_import)

    ray.init(
        num_cpus=NUM_CPUS,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=1 << 30,
        logging_level="ERROR",
    )

    def m_rss():
        a = Echo.remote()
        try:
            pid = ray.get(a.pid.remote())
            time.sleep(1.0)
            rec.set("idle_worker_rss_mb", [bu.rss_mb(pid)])
            rec.result["worker_pid_seen"] = pid
        finally:
            _kill([a])

    rec.run("idle_worker_rss_mb", m_rss)

    def m_spawn():
        def one() -> float:
            t = time.perf_counter()
            actors = [Echo.remote() for _ in range(4)]
            ray.get([a.echo.remote() for a in actors])
            dt = time.perf_counter() - t
            _kill(actors)
            del actors
            time.sleep(0.2)  # let the killed workers exit (keeps <= 4 worker procs alive)
            return dt

        rec.set("spawn_s", bu.sample_rounds(args, one))

    rec.run("spawn_s", m_spawn)

    sync_a = Echo.remote()
    async_a = AsyncEcho.remote()
    ray.get([sync_a.echo.remote(0), async_a.echo.remote(0)])

    def m_rt_sync():
        rec.set(
            "rt_sync_us",
            bu.sample_rounds(
                args, lambda: bu.timed_loop(lambda i: ray.get(sync_a.echo.remote(i)), 2000, args.loop_s) * 1e6
            ),
        )

    rec.run("rt_sync_us", m_rt_sync)

    def m_rt_await():
        rec.set(
            "rt_await_us",
            bu.sample_rounds(
                args,
                lambda: (
                    asyncio.run(bu.timed_loop_async(lambda i: async_a.echo.remote(i), 2000, args.loop_s))
                    * 1e6
                ),
            ),
        )

    rec.run("rt_await_us", m_rt_await)

    def m_outstanding():
        N = 10_000

        def one() -> float:
            t = time.perf_counter()
            refs = [sync_a.echo.remote(i) for i in range(N)]
            ray.get(refs)
            return N / (time.perf_counter() - t)

        rec.set("outstanding_calls_per_s", bu.sample_rounds(args, one))

    rec.run("outstanding_calls_per_s", m_outstanding)

    def m_payload_bytes():
        data = os.urandom(bu.PAYLOAD_BYTES)

        def one() -> float:
            t = time.perf_counter()
            n = ray.get(sync_a.nbytes.remote(data))
            dt = time.perf_counter() - t
            assert n == bu.PAYLOAD_BYTES, n
            return bu.PAYLOAD_BYTES / 1e6 / dt

        rec.set("payload_bytes_mb_per_s", bu.sample_rounds(args, one))

    rec.run("payload_bytes_mb_per_s", m_payload_bytes)

    def m_payload_numpy():
        arr = np.random.default_rng(0).random(bu.NUMPY_ELEMS, dtype=np.float32)

        def one() -> float:
            t = time.perf_counter()
            n = ray.get(sync_a.nbytes.remote(arr))
            dt = time.perf_counter() - t
            assert n == arr.nbytes, n
            return arr.nbytes / 1e6 / dt

        rec.set("payload_numpy_mb_per_s", bu.sample_rounds(args, one))

    rec.run("payload_numpy_mb_per_s", m_payload_numpy)

    _kill([sync_a, async_a])
    time.sleep(0.2)

    def m_gather():
        actors = [Echo.remote() for _ in range(4)]
        try:
            ray.get([a.echo.remote(0) for a in actors])
            rec.set(
                "gather_per_s",
                bu.sample_rounds(
                    args,
                    lambda: (
                        1.0
                        / bu.timed_loop(
                            lambda i: ray.get([a.echo.remote(i) for a in actors]), 2000, args.loop_s
                        )
                    ),
                ),
            )
        finally:
            _kill(actors)

    rec.run("gather_per_s", m_gather)

    if rec.want("inproc_rt_us"):
        rec.null("inproc_rt_us", "Ray has no in-process actor")

    rec.finish()
    ray.shutdown()


if __name__ == "__main__":
    main()
