"""Fixtures of the launcher tests; the helpers live in ``launch_helpers``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import alive, all_processes, kill_leftovers, wait_while
from launch_helpers import Scripts, monarch_launch
from multinode_helpers import DDP_PRELOAD, DDP_TRAIN


def _assert_nothing_left_from(s: Scripts) -> None:
    """Nothing started from the scripts directory ``s`` may still run (what is, is killed)."""
    marker = str(s.root)

    def leftovers() -> list[psutil.Process]:
        found = []
        for p in all_processes(["cmdline"]):
            if p.pid != os.getpid() and any(marker in c for c in (p.info["cmdline"] or [])):
                found.append(p)
        return alive(found)

    left = wait_while(leftovers)
    kill_leftovers(left)
    assert not left, f"processes left behind: {[(p.pid, p.info['cmdline']) for p in left]}"


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[Scripts]:
    """A scripts directory; after the test, nothing started from it may still run."""
    s = Scripts(tmp_path / "scripts")
    yield s
    _assert_nothing_left_from(s)


@pytest.fixture(scope="session")
def one_node_ddp_loss(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The final loss of ``DDP_TRAIN`` on one node x 4 ranks, which every multi-node launch of
    it must reproduce: the same for all of those tests, so trained once per session."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("one-node-ddp")
    s = Scripts(root / "scripts")
    script = s.write("train.py", DDP_TRAIN)
    run = monarch_launch(*DDP_PRELOAD, "--nproc-per-node", "4", script, str(root / "loss"), timeout=120)
    _assert_nothing_left_from(s)
    assert run.rc == 0, run
    return float((root / "loss").read_text())
