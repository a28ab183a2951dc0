"""The benchmark (`_benchutil.METRICS`) on Ray actors: the same metrics as bench_monarch_api.py.

    python benchmarks/bench_ray.py [--rounds 5] [--warmup 1] [--out FILE]

Same JSON layout and metric keys as bench_monarch_api.py. Mapping:
  spawn     : 4 fresh actors (= 4 worker processes) + first reply from all, then ray.kill
  rt_*      : one actor, ray.get(a.echo.remote(i)) / `await a.echo.remote(i)` (async actor)
  outstanding: 10,000 .remote() refs, then ray.get(refs)
  gather    : ray.get([a.echo.remote() for a in 4 actors])
  payload   : bytes / numpy passed as an argument (Ray puts it in the object store)
  inproc_rt_us: null (Ray has no in-process actor)

With --peer-host HEAD:PORT it joins that running Ray cluster instead of starting one: the peer's
actors go to the node offering `_benchutil.RAY_PEER_RESOURCE`, the meshes' stay on this node.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


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

    def __init__(self, n: int, options: dict[str, Any]) -> None:
        self.actors = [EchoActor.options(**options).remote() for _ in range(n)]

    def echo_all(self, x) -> None:
        ray.get([a.echo.remote(x) for a in self.actors])

    async def echo_all_async(self, x) -> None:
        await asyncio.gather(*[a.echo.remote(x) for a in self.actors])

    def worker_pid(self) -> int:
        return ray.get(self.actors[0].pid.remote())

    def stop(self) -> None:
        _kill(self.actors)
        self.actors = []
        time.sleep(0.2)  # let the killed workers exit (keeps <= 4 worker procs alive)


class RayPeer:
    def __init__(self, options: dict[str, Any]) -> None:
        self.sync = EchoActor.options(**options).remote()
        self.async_ = AsyncEchoActor.options(**options).remote()
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
        #: `.options()` of the meshes' actors and of the peer's (placement on a two-node cluster).
        self.mesh_options: dict[str, Any] = {}
        self.peer_options: dict[str, Any] = {}

    def start(self, transport: str | None, peer_host: str | None) -> None:
        if transport not in (None, "tcp"):
            raise ValueError(f"Ray talks over TCP only, not {transport!r}")
        if peer_host is None:
            ray.init(
                num_cpus=bu.RAY_NUM_CPUS,
                include_dashboard=False,
                log_to_driver=False,
                object_store_memory=bu.RAY_OBJECT_STORE_BYTES,
                logging_level="ERROR",
            )
            return
        ray.init(address=peer_host.removeprefix("tcp://"), log_to_driver=False, logging_level="ERROR")
        if not any(node["Alive"] and bu.RAY_PEER_RESOURCE in node["Resources"] for node in ray.nodes()):
            raise RuntimeError(
                f"no node of the Ray cluster at {peer_host} offers the resource {bu.RAY_PEER_RESOURCE!r}; "
                f"HINT: start it with `ray start --address=... --resources '{{\"{bu.RAY_PEER_RESOURCE}\": 1000}}'`"
            )
        # As monarch's `this_host()`: the meshes on the driver's node, only the peer elsewhere.
        here = ray.get_runtime_context().get_node_id()
        self.mesh_options = {"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)}
        self.peer_options = {"resources": {bu.RAY_PEER_RESOURCE: 1}}

    def spawn(self, n: int) -> RayMesh:
        return RayMesh(n, self.mesh_options)

    def spawn_peer(self) -> RayPeer:
        return RayPeer(self.peer_options)

    def inproc_echo(self):
        raise bu.NotMeasured("Ray has no in-process actor")

    def inproc_echo_async(self):
        raise bu.NotMeasured("Ray has no in-process actor")

    def shutdown(self) -> None:
        ray.shutdown()


if __name__ == "__main__":
    bu.run_benchmark(Ray())
