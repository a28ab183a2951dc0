"""Tree multicast: ``call()`` on meshes spanning host agents, flat (one frame per rank from the
client) versus tree (one frame per host, replies gathered per host).

Two measurements, each a median over rounds of sequential ``call().get()`` of an endpoint that
returns at once, on ``local:N`` agents of this machine:

* ``4 hosts x 8 procs``: wall time per call and the client's CPU per call, flat and tree;
* the client's CPU per call as hosts grow (2, 4, 8, 16 agents, ``--procs-per-host`` each,
  default 2), flat and tree: with tree multicast it should grow with hosts, not ranks
  (``--hosts 4 --procs-per-host 1,2,4,8`` holds the hosts and grows the ranks).

"Flat" is the same client with its map of forwarders emptied for the measurement (every
message then goes straight to its proc, as before tree multicast). CPU is the client process's
user + system time (``time.process_time``: every thread of it).

Run: .venv/bin/python benchmarks/bench_tree.py [--calls 200] [--rounds 3]
     [--hosts 2,4,8,16] [--procs-per-host 2[,4...]] [--skip-big]
Prints a table, then ONE JSON object as the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from monarch._src.actor import multicast
from monarch.actor import Actor, endpoint, hosts_from_config


class Ping(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


@contextlib.contextmanager
def flat() -> Iterator[None]:
    """Every message straight to its proc, as before tree multicast (benchmark only)."""
    saved = dict(multicast.forwarders)
    multicast.forwarders.clear()
    try:
        yield
    finally:
        multicast.forwarders.update(saved)


def per_call(mesh: Any, calls: int, rounds: int) -> dict[str, float]:
    """Median wall and client-CPU microseconds per ``call().get()``."""
    for _ in range(20):  # warm up connections and code paths
        mesh.ping.call().get(timeout=60)
    walls, cpus = [], []
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            mesh.ping.call().get(timeout=60)
        walls.append((time.perf_counter() - w0) / calls * 1e6)
        cpus.append((time.process_time() - c0) / calls * 1e6)
    return {"wall_us": statistics.median(walls), "cpu_us": statistics.median(cpus)}


def measure(hosts: int, per_host: int, calls: int, rounds: int) -> dict[str, Any]:
    os.environ["MONARCH_BENCH_HOSTS"] = f"local:{hosts}"
    mesh_of_hosts = hosts_from_config("MONARCH_BENCH_HOSTS")
    try:
        procs = mesh_of_hosts.spawn_procs(per_host={"gpus": per_host})
        mesh = procs.spawn("ping", Ping)
        mesh.ping.call().get(timeout=120)
        tree = per_call(mesh, calls, rounds)
        with flat():
            flat_ = per_call(mesh, calls, rounds)
        tree2 = per_call(mesh, calls, rounds)  # again, to see the drift of a noisy machine
        return {
            "hosts": hosts,
            "procs_per_host": per_host,
            "ranks": hosts * per_host,
            "tree": {k: statistics.median([tree[k], tree2[k]]) for k in tree},
            "flat": flat_,
        }
    finally:
        mesh_of_hosts.shutdown().get(timeout=120)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hosts", default="2,4,8,16")
    p.add_argument("--procs-per-host", default="2", help="comma-separated: every hosts x procs pair is run")
    p.add_argument("--skip-big", action="store_true", help="skip 4 hosts x 8 procs")
    args = p.parse_args()
    results: dict[str, Any] = {"calls": args.calls, "rounds": args.rounds, "scaling": []}
    rows = []
    if not args.skip_big:
        results["big"] = big = measure(4, 8, args.calls, args.rounds)
        rows.append(big)
    for h in (int(x) for x in args.hosts.split(",") if x):
        for per_host in (int(x) for x in args.procs_per_host.split(",") if x):
            r = measure(h, per_host, args.calls, args.rounds)
            results["scaling"].append(r)
            rows.append(r)
    print(
        f"{'hosts':>5} {'ranks':>5} | {'tree wall':>10} {'tree cpu':>9} | {'flat wall':>10} {'flat cpu':>9}"
    )
    for r in rows:
        t, f = r["tree"], r["flat"]
        print(
            f"{r['hosts']:>5} {r['ranks']:>5} | {t['wall_us']:>8.0f}us {t['cpu_us']:>7.0f}us"
            f" | {f['wall_us']:>8.0f}us {f['cpu_us']:>7.0f}us"
        )
    sys.stdout.flush()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
