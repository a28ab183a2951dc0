"""The tensor engine: how fast a client drives distributed tensors on a 4-proc mesh.

Written only against Monarch's public API (``ProcMesh.activate``, ``monarch.fetch_shard``), so
it runs unchanged under monarch-aio (the checkout's .venv) and Meta's torchmonarch
(.venvs/torchmonarch), whose tensor engine may need what this machine lacks (it says so).

    python benchmarks/bench_tensor.py [--ops 20000] [--fetches 200] [--procs 4]

Metrics:
- ``issue ops/s``: small elementwise ops (``t = t + 1`` on 4 floats) issued by the client under
  ``activate()``, back to back (pipelined: no op waits for the one before);
- ``completed ops/s``: the same ops, counted once the last one's value is fetched back, so
  every proc has run them all;
- ``fetch_shard latency``: median and p90 of ``fetch_shard(t).get()`` of a 4-float tensor.

Prints a table, then ONE JSON object as the last line. Run it from a directory that has no
``monarch/`` folder (so that the venv's monarch is the one imported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=20000, help="elementwise ops per measured round")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds of --ops ops")
    p.add_argument("--fetches", type=int, default=200, help="fetch_shard calls measured")
    p.add_argument("--procs", type=int, default=4, help="procs of the mesh")
    args = p.parse_args()

    import torch

    import monarch
    from monarch.actor import this_host

    impl = "torchmonarch" if "torchmonarch" in sys.prefix else "monarch-aio"
    result: dict[str, object] = {"impl": impl, "procs": args.procs, "ops": args.ops}
    procs = this_host().spawn_procs(per_host={"gpus": args.procs})
    try:
        with procs.activate():
            t = torch.zeros(4)
        monarch.fetch_shard(t).get()  # workers up, torch imported there

        issue, done = [], []
        for _ in range(args.rounds + 1):  # the first round warms up
            start = time.perf_counter()
            with procs.activate():
                for _ in range(args.ops):
                    t = t + 1
            issued = time.perf_counter()
            monarch.fetch_shard(t).get()
            finished = time.perf_counter()
            issue.append(args.ops / (issued - start))
            done.append(args.ops / (finished - start))
        final = monarch.fetch_shard(t, gpus=args.procs - 1).get()
        expected = float(args.ops * (args.rounds + 1))
        if final.tolist() != [expected] * 4:  # the ops really ran, every one of them, on the last proc too
            raise AssertionError(f"the last proc holds {final.tolist()}, expected [{expected}] * 4")
        result["issue_ops_per_s"] = statistics.median(issue[1:])
        result["completed_ops_per_s"] = statistics.median(done[1:])

        latencies = []
        for i in range(args.fetches + 10):
            start = time.perf_counter()
            monarch.fetch_shard(t).get()
            if i >= 10:
                latencies.append(time.perf_counter() - start)
        latencies.sort()
        result["fetch_ms_p50"] = 1e3 * statistics.median(latencies)
        result["fetch_ms_p90"] = 1e3 * latencies[int(0.9 * len(latencies))]
    except Exception as e:  # the engine does not run here: say how it fails
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        try:
            procs.stop().get()
        except Exception:
            pass

    if "error" not in result:
        print(f"{'metric':<28}{impl:>16}")
        print(f"{'issue ops/s':<28}{result['issue_ops_per_s']:>16,.0f}")
        print(f"{'completed ops/s':<28}{result['completed_ops_per_s']:>16,.0f}")
        print(f"{'fetch_shard p50 (ms)':<28}{result['fetch_ms_p50']:>16.3f}")
        print(f"{'fetch_shard p90 (ms)':<28}{result['fetch_ms_p90']:>16.3f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
