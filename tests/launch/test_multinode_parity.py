"""Multi-node ``python -m monarch.launch`` against real torchrun: two launchers on loopback,
the same command, and every worker's environment compared rank by rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_helpers import TORCHRUN, Scripts, free_port
from multinode_helpers import DUMP_ENV, launcher, read_envs, run_nodes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed"),
]

#: Legitimately different per run: the ports of stores the launchers bound.
RANDOM = {"MASTER_PORT"}


def node_commands(backend: str, tool: str, script: str, out: Path) -> list[list[str]]:
    common = ["--nnodes", "2", "--nproc-per-node", "2"]
    if backend.startswith("c10d"):
        endpoint = f"127.0.0.1:{free_port()}"
        flags = [common + ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "job7"]] * 2
        if backend == "c10d-uneven":
            # Nodes with different --nproc-per-node (1 and 2): ranks stay contiguous per node.
            flags = [flags[0] + ["--nproc-per-node", "1"], flags[1]]
    else:
        port = str(free_port())
        flags = [
            common + ["--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", port]
            for n in (1, 0)
        ]
    return [launcher(tool) + f + [script, str(out)] for f in flags]


def dumped(scripts: Scripts, tmp_path: Path, backend: str, tool: str) -> list[dict[str, str]]:
    script = scripts.write("dump_env.py", DUMP_ENV)
    out = tmp_path / tool
    out.mkdir()
    runs = run_nodes(node_commands(backend, tool, script, out), timeout=90)
    assert [r.rc for r in runs] == [0, 0], runs
    return read_envs(out, 3 if backend == "c10d-uneven" else 4)


@pytest.mark.parametrize("backend", ["c10d", "static", "c10d-uneven"])
def test_two_launchers_give_every_rank_torchruns_environment(
    scripts: Scripts, tmp_path: Path, backend: str
) -> None:
    ours = dumped(scripts, tmp_path, backend, "monarch")
    theirs = dumped(scripts, tmp_path, backend, "torchrun")
    for rank, (mine, ref) in enumerate(zip(ours, theirs, strict=True)):
        for env in (mine, ref):
            assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{env['LOCAL_RANK']}/error.json")
            del env["TORCHELASTIC_ERROR_FILE"]  # under each launcher's own temporary log dir
        differing = {k: (mine.get(k), ref.get(k)) for k in set(mine) | set(ref) if mine.get(k) != ref.get(k)}
        assert set(differing) <= RANDOM, f"rank {rank}: {differing}"
        assert (mine["RANK"], mine["WORLD_SIZE"]) == (str(rank), str(len(ours)))
    # Every rank of one run sees the same store.
    assert len({env["MASTER_PORT"] for env in ours}) == 1
