"""Fixtures of the fault tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_tmpdir() -> Iterator[Path]:
    """An empty directory with a short path, to be a client's ``$TMPDIR`` (a Unix socket path
    must fit in 107 bytes, and pytest's ``tmp_path`` is long)."""
    path = Path(tempfile.mkdtemp(prefix="m-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
