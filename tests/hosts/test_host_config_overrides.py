"""``monarch.config.configure()`` overrides made in the client reach the procs it spawns on agent
hosts, except the settings of one machine (transport, bind address, TLS files), which stay the
agent host's own."""

from __future__ import annotations

import pytest

from monarch.actor import Actor, endpoint
from monarch.config import configured, get_global_config

pytestmark = pytest.mark.timeout(60)


class Settings(Actor):
    @endpoint
    def settings(self) -> dict:
        return get_global_config()


def test_client_overrides_reach_procs_on_agent_hosts_but_not_per_machine_ones(hosts2: object) -> None:
    hosts2.initialized.get(timeout=30)  # type: ignore[attr-defined]  # (attaching reads the TLS files)
    with configured(
        peer_unreachable_s=77, cleanup_timeout="4s", tcp_bind_host="192.0.2.1", tls_ca="/nowhere"
    ):
        procs = hosts2.spawn_procs(per_host={"gpus": 1})  # type: ignore[attr-defined]
    settings = procs.spawn("settings", Settings).settings.call().get(timeout=30)
    for _, s in settings.items():
        assert (s["peer_unreachable_s"], s["cleanup_timeout_s"]) == (77, 4), s
        assert (s["tcp_bind_host"], s["tls_ca"]) == ("127.0.0.1", ""), s  # the agent host's own
    procs.stop().get(timeout=30)
