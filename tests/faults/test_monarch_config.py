"""``monarch.config``: Monarch's configure / configured / get_global_config over our settings table.

Every field of ``RuntimeConfig`` is a setting; ``configure`` checks every value before it
changes anything, and what it sets reaches the processes spawned afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import fields
from typing import Any

import pytest

from monarch._src.runtime.config import OVERRIDES_ENV, RuntimeConfig
from monarch.actor import Actor, endpoint, this_host
from monarch.config import (
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
)

pytestmark = pytest.mark.timeout(60)

TEN_GIB = 10 << 30


class ConfigProbe(Actor):
    @endpoint
    def settings(self) -> dict[str, Any]:
        from monarch.config import get_global_config

        return get_global_config()


def test_configured_overrides_and_restores() -> None:
    before = get_global_config()
    assert before["codec_max_frame_length"] == before["max_frame_bytes"] == TEN_GIB
    with configured(codec_max_frame_length=1 << 20, shm_pool_idle_s="1m 30s") as merged:
        assert merged["max_frame_bytes"] == merged["codec_max_frame_length"] == 1 << 20
        assert merged["shm_pool_idle_s"] == 90.0
        assert get_runtime_config() == {"max_frame_bytes": 1 << 20, "shm_pool_idle_s": 90.0}
        with configured(shm_pool_idle_s=5) as inner:
            assert inner["shm_pool_idle_s"] == 5.0 and inner["max_frame_bytes"] == 1 << 20
        assert get_global_config()["shm_pool_idle_s"] == 90.0
    assert get_global_config() == before
    assert get_runtime_config() == {} and OVERRIDES_ENV not in os.environ


def test_durations_take_seconds_or_humantime() -> None:
    for text, seconds in [
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h 30m", 5400.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
    ]:
        with configured(shm_pool_idle_s=text) as merged:
            assert merged["shm_pool_idle_s"] == seconds, text


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"does_not_exist": 42}, ValueError, "unknown monarch config key 'does_not_exist'"),
        ({"codec_max_frame_length": "big"}, TypeError, "codec_max_frame_length takes int, got str"),
        ({"max_frame_bytes": True}, TypeError, "max_frame_bytes takes int, got bool"),
        ({"shm_pool_idle_s": "30"}, TypeError, "Invalid duration format for shm_pool_idle_s"),
        ({"shm_pool_idle_s": "abc123"}, TypeError, "Invalid duration format"),
        ({"shm_pool_bytes": -1}, ValueError, "shm_pool_bytes must be >= 0"),
    ],
)
def test_bad_settings_raise_and_change_nothing(settings: dict[str, Any], error: type, message: str) -> None:
    before = get_global_config()
    with pytest.raises(error, match=message):
        # A good setting next to the bad one is not applied either.
        configure(stop_timeout_s=1, **settings)
    with pytest.raises(error, match=message):
        with configured(stop_timeout_s=1, **settings):
            pass
    assert get_global_config() == before and get_runtime_config() == {}


def test_unknown_key_hint_lists_the_settings() -> None:
    with pytest.raises(ValueError) as info:
        configure(cleanup_timeot="3s")
    hint = str(info.value).splitlines()[-1]
    assert hint.startswith("HINT: the settings are:")
    assert all(f.name in hint for f in fields(RuntimeConfig))


def test_every_setting_of_the_table_is_configurable() -> None:
    """A field added to RuntimeConfig needs no other change to be configurable."""
    current = get_global_config()
    names = [f.name for f in fields(RuntimeConfig)]
    assert set(names) <= set(current)
    with configured(**{name: current[name] for name in names}) as merged:
        assert get_runtime_config() == {name: current[name] for name in names}
        assert merged == current
    clear_runtime_config()
    assert get_runtime_config() == {}


def test_workers_spawned_afterwards_inherit_the_settings() -> None:
    with configured(codec_max_frame_length=123_456_789, shm_pool_idle_s="2m"):
        inside = this_host().spawn_procs(per_host={"gpus": 2})
    after = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        seen = inside.spawn("probe", ConfigProbe).settings.call().get(timeout=30)
        for _, settings in seen.items():
            assert settings["codec_max_frame_length"] == 123_456_789
            assert settings["shm_pool_idle_s"] == 120.0
        later = after.spawn("probe", ConfigProbe).settings.call_one().get(timeout=30)
        assert later["codec_max_frame_length"] == TEN_GIB and later["shm_pool_idle_s"] == 30.0
    finally:
        inside.stop().get(timeout=15)
        after.stop().get(timeout=15)


CLIENT = textwrap.dedent(
    """
    import monarch.config
    from monarch.actor import Actor, endpoint, this_host

    class Length(Actor):
        @endpoint
        def length(self, data):
            import monarch.config
            return len(data), monarch.config.get_global_config()["codec_max_frame_length"]

    monarch.config.configure(codec_max_frame_length=500_000)
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        m = pm.spawn("length", Length)
        print("small", *m.length.call_one(b"x" * 1000).get(timeout=20), flush=True)
        try:
            m.length.call_one(b"x" * 600_000).get(timeout=20)
        except Exception as e:
            print("big", type(e).__name__, repr(str(e)), flush=True)
    finally:
        pm.stop().get(timeout=10)
    """
)


def test_configured_frame_limit_applies_to_the_client_and_its_workers() -> None:
    proc = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True, timeout=45)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines()}
    assert lines["small"] == "small 1000 500000"
    big = lines["big"]
    assert "FrameTooLargeError" in big and "rejecting oversize frame" in big and "max=500000" in big
    # The hint names a setting that exists.
    assert "monarch.config.configure(codec_max_frame_length=N)" in big


def test_import_is_cheap() -> None:
    code = (
        "import sys, monarch.config; "
        "print(sorted(m for m in sys.modules if m.startswith('monarch') or m in ('asyncio', 'uvloop', 'torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    loaded = eval(out.stdout)
    assert loaded == [
        "monarch",
        "monarch._src",
        "monarch._src.runtime",
        "monarch._src.runtime.config",
        "monarch.config",
    ]
