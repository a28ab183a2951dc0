"""Fixtures of the fault tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch.actor import MeshFailure


@pytest.fixture
def short_tmpdir() -> Iterator[Path]:
    """An empty directory with a short path, to be a client's ``$TMPDIR`` (a Unix socket path
    must fit in 107 bytes, and pytest's ``tmp_path`` is long)."""
    path = Path(tempfile.mkdtemp(prefix="m-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    """Every failure that reached the client's root (in place of ``unhandled_fault_hook``)."""
    import monarch.actor

    seen: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", seen.append)
    return seen
