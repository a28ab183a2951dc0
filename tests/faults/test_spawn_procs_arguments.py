"""``spawn_procs`` takes ``None`` for every optional argument, and says what a bad ``preload`` is."""

from __future__ import annotations

import os

import pytest
from actors import Pid

from monarch.actor import this_host

pytestmark = pytest.mark.timeout(60)


def test_none_for_every_optional_argument_is_accepted() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=None, name=None, env=None, preload=None)
    try:
        pids = pm.spawn("pid", Pid).pid.call().get(timeout=30)
        assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    finally:
        pm.stop().get(timeout=15)


def test_a_module_name_string_for_preload_is_a_clear_error() -> None:
    with pytest.raises(
        TypeError, match=r"preload takes a list of module names, got the string 'torch'"
    ) as info:
        this_host().spawn_procs(per_host={"gpus": 1}, preload="torch")
    assert "HINT: preload=['torch']" in str(info.value)
