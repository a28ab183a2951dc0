"""RDMABuffer throughput: 256 MiB ``read_into`` and ``write_from`` against sending the same
array as an endpoint argument, for monarch-aio (one host, and across two network namespaces)
and torchmonarch (its TCP fallback: no ibverbs device here).

The driver (no ``--measure``) runs one measuring client per implementation and placement,
interleaved, ``--passes`` times, and prints a markdown table of medians. A measuring client
owns the bytes in one proc and moves them from a peer proc (another host with ``--netns``);
times are taken in the peer, around the transfer only.

Run (root, for --netns): .venv/bin/python benchmarks/bench_rdma.py --netns
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
TORCHMONARCH = ROOT / ".venvs" / "torchmonarch" / "bin" / "python"
#: ``endpoint_arg``: the owner gets the array as an argument (on one host, mapped from
#: /dev/shm, not read); ``endpoint_arg_into``: and copies it into its own array, as a weight
#: update would, which is where a ``read_into`` leaves the bytes.
METRICS = ("read_into", "write_from", "endpoint_arg", "endpoint_arg_into")


def measure(size: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per round of each metric, taken in the peer proc."""
    import numpy as np

    from monarch.actor import Actor, endpoint, this_host
    from monarch.rdma import RDMABuffer

    class Owner(Actor):
        def __init__(self, n: int) -> None:
            self.data = np.full(n, 7, dtype=np.uint8)
            self.buffer = RDMABuffer(memoryview(self.data))

        @endpoint
        def get_buffer(self) -> RDMABuffer:
            return self.buffer

        @endpoint
        def take(self, array: object, into: bool) -> None:
            if into:
                np.copyto(self.data, array)

    class Peer(Actor):
        @endpoint
        def run(self, owner: Owner, buffer: RDMABuffer, n: int, rounds: int) -> dict[str, list[float]]:
            local = np.full(n, 1, dtype=np.uint8)
            times: dict[str, list[float]] = {m: [] for m in METRICS}
            for _ in range(rounds + 1):  # the first round warms up (connections, page faults)
                start = time.perf_counter()
                buffer.read_into(memoryview(local)).get()
                times["read_into"].append(time.perf_counter() - start)
                assert local[0] == 7 and local[-1] == 7
                start = time.perf_counter()
                buffer.write_from(memoryview(local)).get()
                times["write_from"].append(time.perf_counter() - start)
                for metric, into in (("endpoint_arg", False), ("endpoint_arg_into", True)):
                    start = time.perf_counter()
                    owner.take.call_one(local, into).get()
                    times[metric].append(time.perf_counter() - start)
            return {m: t[1:] for m, t in times.items()}

    hosts_env = os.environ.get("BENCH_RDMA_HOSTS")
    if hosts_env:  # owner on the first host, peer on the second (monarch-aio's host agents)
        from monarch.actor import hosts_from_config

        procs = hosts_from_config("BENCH_RDMA_HOSTS").spawn_procs(per_host={"gpus": 1})
        owner_procs, peer_procs = procs.slice(hosts=0), procs.slice(hosts=1)
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        owner_procs, peer_procs = procs.slice(gpus=0), procs.slice(gpus=1)
    owner = owner_procs.spawn("owner", Owner, size)
    peer = peer_procs.spawn("peer", Peer)
    buffer = owner.get_buffer.call_one().get()
    return peer.run.call_one(owner, buffer, size, rounds).get()


def _client(python: str, size: int, rounds: int, cwd: str, env: dict[str, str]) -> dict[str, list[float]]:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        cmd = [
            python,
            str(Path(__file__).resolve()),
            "--measure",
            out.name,
            "--size",
            str(size),
            "--rounds",
            str(rounds),
        ]
        done = subprocess.run(
            cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        return json.loads(Path(out.name).read_text())


def drive(args: argparse.Namespace) -> None:
    placements: dict[str, tuple[str, str, dict[str, str]]] = {"monarch-aio": (sys.executable, str(ROOT), {})}
    if TORCHMONARCH.exists():
        # Outside the repository: its workers import `monarch` from the current directory.
        placements["torchmonarch"] = (str(TORCHMONARCH), tempfile.gettempdir(), {})
    cluster = agents = None
    if args.netns:
        sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "hosts")]
        import netns
        from tcp_helpers import ClusterAgents

        reason = netns.unavailable_reason()
        if reason:
            sys.exit(f"--netns: {reason}")
        cluster = netns.Cluster(2).__enter__()
        secret = Path(tempfile.mkdtemp()) / "secret"
        secret.write_text("bench-rdma-secret")
        secret.chmod(0o600)
        agents = ClusterAgents(cluster, str(secret))
        placements["monarch-aio@netns"] = (
            sys.executable,
            str(ROOT),
            {
                "MONARCH_TRANSPORT": "tcp",
                "MONARCH_TCP_BIND_HOST": cluster.bridge_address,
                "BENCH_RDMA_HOSTS": ",".join(agents.addresses),
                "MONARCH_HOST_SECRET_FILE": str(secret),
            },
        )
    samples: dict[str, dict[str, list[float]]] = {p: {m: [] for m in METRICS} for p in placements}
    try:
        for i in range(args.passes):
            for name, (python, cwd, env) in placements.items():
                for metric, times in _client(python, args.size, args.rounds, cwd, env).items():
                    samples[name][metric].extend(times)
                print(f"pass {i + 1}/{args.passes}: {name} done", file=sys.stderr, flush=True)
    finally:
        if agents is not None:
            for agent in agents.procs:
                agent.kill()
                agent.wait()
        if cluster is not None:
            cluster.close()
    print(table(samples, args.size))


def table(samples: dict[str, dict[str, list[float]]], size: int) -> str:
    def rate(name: str, metric: str) -> float:
        return size / statistics.median(samples[name][metric]) / 1e9

    lines = [
        f"| {size // MiB} MiB | read_into | write_from | endpoint argument | argument copied into place "
        "| read_into / argument | write_from / argument | read_into / argument copied |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in samples:
        r, w, e, c = (rate(name, m) for m in METRICS)
        lines.append(
            f"| {name} | {r:.2f} GB/s | {w:.2f} GB/s | {e:.2f} GB/s | {c:.2f} GB/s | {r / e:.2f}x | {w / e:.2f}x | {r / c:.2f}x |"
        )
    if "torchmonarch" in samples:
        lines.append("")
        for m in METRICS[:2]:
            lines.append(
                f"monarch-aio / torchmonarch, {m}: {rate('monarch-aio', m) / rate('torchmonarch', m):.1f}x"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=256 * MiB, help="bytes per transfer (default 256 MiB)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per client, after one warm-up")
    p.add_argument("--passes", type=int, default=2, help="interleaved passes over the implementations")
    p.add_argument(
        "--netns", action="store_true", help="also monarch-aio across two network namespaces (root)"
    )
    p.add_argument("--measure", metavar="OUT", help=argparse.SUPPRESS)  # a measuring client
    args = p.parse_args()
    if args.measure:
        Path(args.measure).write_text(json.dumps(measure(args.size, args.rounds)))
        os._exit(0)  # skip interpreter teardown: the procs go with this client
    drive(args)


if __name__ == "__main__":
    main()
