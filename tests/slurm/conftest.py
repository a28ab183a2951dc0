"""Fixtures of the SLURM tests: a throw-away SLURM cluster on this machine (``slurm_cluster``)."""

from __future__ import annotations

from collections.abc import Iterator

import netns
import pytest
import slurm_cluster


@pytest.fixture(scope="session")
def slurm_ready() -> None:
    """Skip where this machine cannot run a cluster (probed once per session); else remove the
    leftovers of earlier runs that were killed before their teardown."""
    reason = slurm_cluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    netns.remove_stale()
    slurm_cluster.remove_stale()


@pytest.fixture
def slurm2(slurm_ready: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[slurm_cluster.SlurmCluster]:
    """A SLURM cluster of two nodes (``n1``, ``n2``), each in its own network namespace, torn
    down after the test; ``SLURM_CONF`` points at it meanwhile, so SLURM's commands run by the
    test (and by code under test) use it."""
    with slurm_cluster.SlurmCluster(2) as cluster:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster
