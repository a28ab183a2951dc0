"""RDMABuffer throughput: 256 MiB ``read_into`` and ``write_from`` against sending the same
array as an endpoint argument, for monarch-aio (one host, and across two network namespaces)
and torchmonarch (its TCP fallback: no ibverbs device here).

The driver (no ``--measure``) runs one measuring client per implementation and placement,
interleaved, ``--passes`` times, and prints a markdown table of medians. A measuring client
owns the bytes in one proc and moves them from a peer proc (another host with ``--netns``);
times are taken in the peer, around the transfer only.

Run (root, for --netns): .venv/bin/python benchmarks/bench_rdma.py --netns
(torchmonarch from ``bash benchmarks/setup_peers.sh``, or a ``.venvs`` link to a checkout's.)
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
sys.path.insert(0, str(ROOT / "benchmarks"))
import run_all  # noqa: E402  (the peers' agents across namespaces, as the actor benchmarks start them)

MiB = 1 << 20
TORCHMONARCH = ROOT / ".venvs" / "torchmonarch" / "bin" / "python"
#: ``endpoint_arg``: the owner gets the array as an argument (on one host, mapped from
#: /dev/shm, not read); ``endpoint_arg_into``: and copies it into its own array, as a weight
#: update would, which is where a ``read_into`` leaves the bytes.
METRICS = ("read_into", "write_from", "endpoint_arg", "endpoint_arg_into")


def measure(size: int, rounds: int, peer_host: str | None) -> dict[str, list[float]]:
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

    if peer_host is not None:  # the owner on this client's host, the peer on the agent's
        from monarch.actor import attach_to_workers, enable_transport

        enable_transport("tcp")
        hosts = attach_to_workers(ca="trust_all_connections", workers=[peer_host])
        owner_procs = this_host().spawn_procs(per_host={"gpus": 1})
        peer_procs = hosts.spawn_procs(per_host={"gpus": 1})
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        owner_procs, peer_procs = procs.slice(gpus=0), procs.slice(gpus=1)
    owner = owner_procs.spawn("owner", Owner, size)
    peer = peer_procs.spawn("peer", Peer)
    buffer = owner.get_buffer.call_one().get()
    return peer.run.call_one(owner, buffer, size, rounds).get()


def _client(cmd: list[str], cwd: str, env: dict[str, str], out: str) -> dict[str, list[float]]:
    done = subprocess.run(
        cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(Path(out).read_text())


def _run_placement(
    name: str, python: str, args: argparse.Namespace, cluster: object, work: str
) -> dict[str, list[float]]:
    """One measuring client of implementation ``name`` (``@netns``: the client in the
    cluster's first namespace, the peer on an agent in the second, started here)."""
    impl = name.removesuffix(run_all.NETNS)
    # torchmonarch runs outside the repository: its workers import `monarch` from the cwd.
    cwd = str(ROOT) if impl == run_all.OURS else work
    out = os.path.join(work, f"{name}.json")
    cmd = [
        python,
        str(Path(__file__).resolve()),
        "--measure",
        out,
        "--size",
        str(args.size),
        "--rounds",
        str(args.rounds),
    ]
    if not name.endswith(run_all.NETNS):
        return _client(cmd, cwd, {}, out)
    client_host, agent_host = cluster.hosts  # type: ignore[attr-defined]
    address = f"{agent_host.address}:{run_all.AGENT_PORT}"
    env = {"MONARCH_TCP_BIND_HOST": client_host.address, "MONARCH_HOST_SECRET": f"bench-{os.getpid()}"}
    agent_cmd = [python, *(word.format(address=address) for word in run_all.AGENTS[impl])]
    cmd = [*cmd, "--peer-host", f"tcp://{address}"]
    if impl in run_all.RESOLVES_HOSTNAME:
        agent_cmd = run_all._hostname_at(agent_host.address, agent_cmd, work)
        cmd = run_all._hostname_at(client_host.address, cmd, work)
    agent = cluster.popen(  # type: ignore[attr-defined]
        agent_host.index,
        agent_cmd,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        run_all._wait_listening(cluster, agent_host.index, run_all.AGENT_PORT, agent)
        return _client(cluster.argv(client_host.index, cmd), cwd, env, out)  # type: ignore[attr-defined]
    finally:
        run_all._kill_group(agent.pid)  # the agent and the procs it spawned
        agent.wait()


def drive(args: argparse.Namespace) -> None:
    pythons = {run_all.OURS: sys.executable}
    if TORCHMONARCH.exists():
        pythons[run_all.TM] = str(TORCHMONARCH)
    names = list(pythons)
    cluster = None
    if args.netns:
        sys.path.insert(0, str(ROOT / "tests"))
        import netns

        reason = netns.unavailable_reason()
        if reason:
            sys.exit(f"--netns: {reason}")
        cluster = netns.Cluster(2).__enter__()
        names += [name + run_all.NETNS for name in pythons]
    samples: dict[str, dict[str, list[float]]] = {n: {m: [] for m in METRICS} for n in names}
    work = tempfile.mkdtemp(prefix="bench-rdma-")
    try:
        for i in range(args.passes):
            for name in names:
                python = pythons[name.removesuffix(run_all.NETNS)]
                for metric, times in _run_placement(name, python, args, cluster, work).items():
                    samples[name][metric].extend(times)
                print(f"pass {i + 1}/{args.passes}: {name} done", file=sys.stderr, flush=True)
    finally:
        if cluster is not None:
            cluster.close()  # type: ignore[attr-defined]
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
    lines.append("")
    for suffix in ("", run_all.NETNS):
        ours, theirs = run_all.OURS + suffix, run_all.TM + suffix
        if ours in samples and theirs in samples:
            for m in METRICS[:2]:
                lines.append(f"{ours} / {theirs}, {m}: {rate(ours, m) / rate(theirs, m):.1f}x  ")
    lines.append(f"(load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=256 * MiB, help="bytes per transfer (default 256 MiB)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per client, after one warm-up")
    p.add_argument("--passes", type=int, default=2, help="interleaved passes over the implementations")
    p.add_argument(
        "--netns", action="store_true", help="also each implementation across two network namespaces (root)"
    )
    p.add_argument("--measure", metavar="OUT", help=argparse.SUPPRESS)  # a measuring client
    p.add_argument("--peer-host", help=argparse.SUPPRESS)  # ... whose peer is on this agent
    args = p.parse_args()
    if args.measure:
        Path(args.measure).write_text(json.dumps(measure(args.size, args.rounds, args.peer_host)))
        os._exit(0)  # skip interpreter teardown: the procs go with this client
    drive(args)


if __name__ == "__main__":
    main()
