"""The benchmark (`_benchutil.METRICS`) on Ray actors: the same metrics as bench_monarch_api.py.

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

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu
import ray

NUM_CPUS = 4


class Echo:
    def echo(self, x=None):
        return x

    def nbytes(self, x):
        n = getattr(x, "nbytes", None)
        return int(n) if n is not None else len(x)

    def pid(self):
        return os.getpid()


class AsyncEcho:
    async def echo(self, x=None):
        return x


#: The actor classes: ``ray.remote`` makes them (typed Any: mypy cannot see what it returns).
EchoActor: Any = ray.remote(num_cpus=0)(Echo)
AsyncEchoActor: Any = ray.remote(num_cpus=0)(AsyncEcho)


def _kill(actors) -> None:
    for a in actors:
        try:
            ray.kill(a)
        except Exception:
            pass


class RayMesh:
    """``n`` actors: Ray starts one worker process for each."""

    def __init__(self, n: int) -> None:
        self.actors = [EchoActor.remote() for _ in range(n)]

    def echo_all(self, x) -> None:
        ray.get([a.echo.remote(x) for a in self.actors])

    def worker_pid(self) -> int:
        return ray.get(self.actors[0].pid.remote())

    def stop(self) -> None:
        _kill(self.actors)
        self.actors = []
        time.sleep(0.2)  # let the killed workers exit (keeps <= 4 worker procs alive)


class RayPeer:
    def __init__(self) -> None:
        self.sync = EchoActor.remote()
        self.async_ = AsyncEchoActor.remote()
        ray.get([self.sync.echo.remote(0), self.async_.echo.remote(0)])

    def echo(self, x):
        return ray.get(self.sync.echo.remote(x))

    def echo_async(self, x):
        return self.async_.echo.remote(x)

    def nbytes(self, x) -> int:
        return ray.get(self.sync.nbytes.remote(x))

    def echo_many(self, n: int) -> None:
        ray.get([self.sync.echo.remote(i) for i in range(n)])

    def stop(self) -> None:
        _kill([self.sync, self.async_])
        time.sleep(0.2)


class Ray:
    """`bu.Impl` for Ray."""

    import_statement = "import ray"

    def __init__(self) -> None:
        self.name = f"ray=={ray.__version__}"
        self.extra: dict = {}

    def start(self, transport: str | None, peer_host: str | None) -> None:
        if peer_host is not None:
            raise ValueError("--peer-host: this adapter runs Ray on one node only")
        if transport not in (None, "tcp"):
            raise ValueError(f"Ray talks over TCP only, not {transport!r}")
        ray.init(
            num_cpus=NUM_CPUS,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=1 << 30,
            logging_level="ERROR",
        )

    def spawn(self, n: int) -> RayMesh:
        return RayMesh(n)

    def spawn_peer(self) -> RayPeer:
        return RayPeer()

    def inproc_echo(self):
        raise bu.NotMeasured("Ray has no in-process actor")

    def shutdown(self) -> None:
        ray.shutdown()


if __name__ == "__main__":
    bu.run_benchmark(Ray())
