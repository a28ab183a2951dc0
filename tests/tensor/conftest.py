"""The mesh most tensor-engine tests share: one per test module, as starting procs (and torch in
them) is most of what these tests cost."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from monarch.actor import ProcMesh, this_host


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    """A {gpus: 2} mesh for the whole test module; its procs are forked from a template that
    imported torch once (preload), which these tests do not tell apart from importing it each."""
    pm = this_host().spawn_procs(per_host={"gpus": 2}, preload=["torch"])
    yield pm
    pm.stop().get(timeout=10)
