"""Fixtures of the many-hosts tests: clusters of network namespaces on this machine (``netns``)."""

from __future__ import annotations

from collections.abc import Iterator

import netns
import pytest


@pytest.fixture(scope="session")
def netns_ready() -> None:
    """Skip where this machine cannot build a cluster (probed once per session); else remove
    the leftovers of earlier runs that were killed before their teardown."""
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    netns.remove_stale()


@pytest.fixture
def cluster2(netns_ready: None) -> Iterator[netns.Cluster]:
    """Two hosts in network namespaces on one bridge, removed after the test."""
    with netns.Cluster(2) as cluster:
        yield cluster
