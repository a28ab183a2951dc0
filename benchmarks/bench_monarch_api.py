"""The benchmark (`_benchutil.METRICS`) on Monarch: an adapter written only against the public
Monarch actor API.

Runs unchanged under monarch-aio (the checkout's .venv) and Meta's torchmonarch
(.venvs/torchmonarch): both import as `monarch`.

    python benchmarks/bench_monarch_api.py [--rounds 5] [--warmup 1] [--out FILE]

Prints ONE JSON object as the last line of stdout (and writes it to --out,
rewritten after each metric so a timeout still leaves partial results).
Run it from a directory that has no `monarch/` folder (run_all.py does).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil as bu

_t0 = time.perf_counter()
import monarch  # noqa: E402
from monarch.actor import Actor, endpoint, this_host, this_proc  # noqa: E402

_in_process_import_s = time.perf_counter() - _t0


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


class MonarchMesh:
    def __init__(self, n: int) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": n})
        self.actors = self.procs.spawn("echo", Echo)

    def echo_all(self, x) -> None:
        self.actors.echo.call(x).get()

    def echo_all_async(self, x):
        return self.actors.echo.call(x)

    def worker_pid(self) -> int:
        return self.actors.pid.call_one().get()

    def stop(self) -> None:
        self.procs.stop().get()


class MonarchPeer:
    def __init__(self, hosts) -> None:
        self.procs = hosts.spawn_procs(per_host={"gpus": 1})
        self.sync = self.procs.spawn("sync_echo", Echo)
        self.async_ = self.procs.spawn("async_echo", AsyncEcho)
        self.sync.echo.call_one(0).get()
        self.async_.echo.call_one(0).get()

    def echo(self, x):
        return self.sync.echo.call_one(x).get()

    def echo_async(self, x):
        return self.async_.echo.call_one(x)

    def nbytes(self, x) -> int:
        return self.sync.nbytes.call_one(x).get()

    def echo_many(self, n: int) -> None:
        futs = [self.sync.echo.call_one(i) for i in range(n)]
        for f in futs:
            f.get()

    def stop(self) -> None:
        self.procs.stop().get()


class Monarch:
    """`bu.Impl` for monarch-aio and torchmonarch alike (both import as `monarch`)."""

    import_statement = "import monarch.actor"

    def __init__(self) -> None:
        self.name = _impl_name()
        self.extra = {"monarch_path": _monarch_origin(), "in_process_import_s": _in_process_import_s}
        self.peer_hosts = None
        self._inproc = None

    def start(self, transport: str | None, peer_host: str | None) -> None:
        # The runtime itself starts with the first spawn, on the transport chosen before it.
        if transport is not None:
            from monarch.actor import enable_transport

            enable_transport(transport)
        if peer_host is not None:
            from monarch.actor import attach_to_workers

            # monarch-aio uses the shared secret of MONARCH_HOST_SECRET when it is set.
            self.peer_hosts = attach_to_workers(ca="trust_all_connections", workers=[peer_host])

    def spawn(self, n: int) -> MonarchMesh:
        return MonarchMesh(n)

    def spawn_peer(self) -> MonarchPeer:
        return MonarchPeer(self.peer_hosts if self.peer_hosts is not None else this_host())

    def inproc_echo(self):
        a = self._inproc_actor()
        return lambda x: a.echo.call_one(x).get()

    def inproc_echo_async(self):
        return self._inproc_actor().echo.call_one

    def _inproc_actor(self):
        if self._inproc is None:
            self._inproc = this_proc().spawn("inproc_echo", Echo)
            self._inproc.echo.call_one(0).get()
        return self._inproc

    def shutdown(self) -> None:
        pass


if __name__ == "__main__":
    bu.run_benchmark(Monarch())
