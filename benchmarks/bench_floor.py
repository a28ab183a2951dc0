"""What this machine allows, before any framework: the cost of waking another thread or process.

    python3 benchmarks/bench_floor.py [--n 3000] [--rounds 5]

A blocking actor call cannot be cheaper than the wake-ups it needs: the caller's thread wakes
the callee, and the callee's reply wakes the caller. Measured here with nothing but the
standard library, so the round-trip targets can be read against them:

* ``process_pingpong_us``: one byte to a forked process and back over a Unix socketpair
  (two process wake-ups, the least a cross-process call costs);
* ``thread_pingpong_us``: two threads of one process handing a lock back and forth (two
  thread wake-ups, the least an in-process call to an actor on its own thread costs).

Prints one JSON object (medians of ``--rounds``) as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import threading
import time


def process_pingpong_us(n: int) -> float:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the echoing child
        ours.close()
        while True:
            data = theirs.recv(64)
            if not data:
                os._exit(0)
            theirs.sendall(data)
    theirs.close()
    try:
        start = time.perf_counter()
        for _ in range(n):
            ours.sendall(b"x")
            ours.recv(64)
        return (time.perf_counter() - start) / n * 1e6
    finally:
        ours.close()
        os.waitpid(pid, 0)


def thread_pingpong_us(n: int) -> float:
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def echo() -> None:
        for _ in range(n):
            ping.acquire()
            pong.release()

    t = threading.Thread(target=echo)
    t.start()
    start = time.perf_counter()
    for _ in range(n):
        ping.release()
        pong.acquire()
    elapsed = time.perf_counter() - start
    t.join()
    return elapsed / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=3000, help="round trips per round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    result = {}
    for name, fn in (
        ("process_pingpong_us", process_pingpong_us),
        ("thread_pingpong_us", thread_pingpong_us),
    ):
        samples = [fn(args.n) for _ in range(args.rounds)]
        result[name] = round(statistics.median(samples), 1)
        print(f"{name}: median {result[name]} us over {args.rounds} rounds of {args.n}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
