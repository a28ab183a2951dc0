"""RDMABuffer over CUDA memory (needs a GPU): 256 MiB between two procs of one host, each side
in CUDA or CPU memory; prints MB/s of the median of 3 reads and 3 writes for each pairing.

``python benchmarks/bench_rdma_cuda.py`` (results in ``benchmarks/RESULTS.md``, "RDMA buffers")."""

import time

import torch

from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer

SIZE = 256 << 20


class Owner(Actor):
    def __init__(self, device: str) -> None:
        self.data = torch.ones(SIZE, dtype=torch.uint8, device=device)
        self.buffer = RDMABuffer(self.data)

    @endpoint
    def get(self) -> RDMABuffer:
        return self.buffer


class Reader(Actor):
    @endpoint
    def time_ops(self, buf: RDMABuffer, device: str) -> list[float]:
        dst = torch.zeros(SIZE, dtype=torch.uint8, device=device)
        out = []
        for op in ("read", "write"):
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                (buf.read_into(dst) if op == "read" else buf.write_from(dst)).get(timeout=120)
                runs.append(time.perf_counter() - t0)
            out.append(SIZE / sorted(runs)[1] / 1e6)
        return out


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    for owner_dev in ("cuda", "cpu"):
        owner = procs.slice(gpus=0).spawn(f"o{owner_dev}", Owner, owner_dev)
        reader = procs.slice(gpus=1).spawn(f"r{owner_dev}", Reader)
        buf = owner.get.call_one().get()
        for dev in ("cuda", "cpu"):
            r, w = reader.time_ops.call_one(buf, dev).get()
            print(f"owner {owner_dev} <-> reader {dev}: read {r:.0f} MB/s, write {w:.0f} MB/s", flush=True)
    procs.stop().get()


if __name__ == "__main__":
    main()
