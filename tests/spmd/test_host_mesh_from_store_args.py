"""``host_mesh_from_store`` refuses what it cannot work with before touching the store."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import run_python

from monarch.spmd import host_mesh_from_store

pytestmark = pytest.mark.timeout(30)


class NoStore:
    """A store that must not be used: the call fails before any key is read or written."""

    def set(self, key: str, value: Any) -> None:
        raise AssertionError(f"store.set({key!r}) before the arguments were checked")

    def get(self, key: str) -> bytes:
        raise AssertionError(f"store.get({key!r}) before the arguments were checked")


def test_missing_env_var_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="requires the RANK env var"):
        host_mesh_from_store(NoStore())
    with pytest.raises(RuntimeError, match="requires the LOCAL_WORLD_SIZE env var"):
        host_mesh_from_store(NoStore(), rank=0, local_rank=0, world_size=2)


def test_world_size_must_divide_into_nodes() -> None:
    with pytest.raises(ValueError, match="divisible"):
        host_mesh_from_store(NoStore(), rank=0, local_rank=0, world_size=3, local_world_size=2)


def test_transport_and_port_are_checked() -> None:
    job = {"rank": 1, "local_rank": 1, "world_size": 2, "local_world_size": 2}
    with pytest.raises(ValueError, match="unknown transport 'metatls'"):
        host_mesh_from_store(NoStore(), transport="metatls", **job)
    with pytest.raises(ValueError, match="needs an explicit monarch_port"):
        host_mesh_from_store(NoStore(), transport="tcp", **job)


def test_a_rank_that_is_not_local_rank_0_only_returns_none() -> None:
    job = {"rank": 1, "local_rank": 1, "world_size": 2, "local_world_size": 2}
    assert host_mesh_from_store(NoStore(), **job) is None


def test_tcp_in_a_process_already_on_unix_sockets_says_what_to_do() -> None:
    # As inside a python -m monarch.launch rank: the runtime already runs, on Unix sockets.
    code = """
from monarch.actor import this_proc
from monarch.spmd import host_mesh_from_store
this_proc()
try:
    host_mesh_from_store(None, transport="tcp", monarch_port=26600, rank=0, local_rank=0, world_size=1, local_world_size=1)
except RuntimeError as e:
    print(e)
"""
    out = run_python(code, timeout=30).stdout
    assert "host_mesh_from_store(transport='tcp')" in out and "use transport='ipc'" in out, out
