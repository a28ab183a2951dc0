"""What ``host_mesh_from_store`` leaves in the store does not let anyone else attach: two
"nodes" (threads, each the local rank 0 of its node, with real host agents) exchange through a
store that an eavesdropper then reads in full."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from monarch._src.host.agent import TRUST_ALL_SECRET
from monarch._src.host.host_mesh import attach
from monarch.actor import Actor, HostMesh, endpoint
from monarch.config import configured
from monarch.spmd import host_mesh_from_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


class DictStore:
    """The two operations of a torch Store, in memory; ``get`` blocks (bounded) like torch's."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.changed = threading.Condition()

    def set(self, key: str, value: Any) -> None:
        with self.changed:
            self.data[key] = value.encode() if isinstance(value, str) else bytes(value)
            self.changed.notify_all()

    def get(self, key: str) -> bytes:
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.data, timeout=30):
                raise TimeoutError(f"store key {key!r} was never set")
            return self.data[key]


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_store_contents_do_not_open_the_agents() -> None:
    store = DictStore()
    nodes = [{"rank": r, "local_rank": 0, "world_size": 2, "local_world_size": 1} for r in (0, 1)]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: host_mesh_from_store(store, **job), nodes))
    hosts, other = results
    assert isinstance(hosts, HostMesh) and other is None
    try:
        pids = hosts.spawn_procs(per_host={"gpus": 1}).spawn("pid", Pid).pid.call().get()
        assert len(set(pids.values())) == 2

        # Everything the store holds, raw and hex-decoded, tried as the agents' secret.
        candidates = {TRUST_ALL_SECRET}
        for value in store.data.values():
            candidates.add(value)
            try:
                candidates.add(bytes.fromhex(value.decode()))
            except ValueError:
                pass
        addresses = [store.data[f"monarch/spmd/workers/{g}"].decode() for g in (0, 1)]
        # A refused client cannot tell a wrong secret from a slow agent: it retries until the
        # attach bound (10 s by default). 3 s is still many times what a good secret takes.
        with configured(host_attach_timeout_s=3):
            intruders = [attach(addresses, secret) for secret in candidates]  # all at once: each retries
            for intruder in intruders:
                with pytest.raises(RuntimeError, match="attach failed"):
                    intruder.initialized.get(30)
    finally:
        hosts.shutdown().get()
