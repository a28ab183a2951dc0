"""A worker that replied to a call awaited on a loop of the client's own has a second connection
to the client (to that loop's reply address, ``loop_replies``). A drop of either connection is
settled by the hello of its own replacement: a reply lost on the client's own address still
fails its call at once (the worker keeps none to send again here), while the other connection
is open."""

from __future__ import annotations

import asyncio
import time

import pytest
from fault_helpers import Probe
from test_reply_connection_dropped import drop_connection_from, where_from_the_loop

from monarch._src.runtime.config import configured
from monarch.actor import this_host


@pytest.mark.timeout(60)
def test_reply_lost_on_the_process_address_fails_at_once_beside_a_loop_reply_connection():
    with configured(resend_keep_messages=0):
        pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        probe = pm.spawn("probe", Probe)
        _, address = where_from_the_loop(probe)

        async def on_a_loop() -> str:
            return await probe.ping.call_one("loop")  # the worker's second connection says hello

        assert asyncio.run(on_a_loop()) == "loop"

        start = time.monotonic()
        lost = drop_connection_from(address, send_first=lambda: probe.ping.call_one("lost"))
        with pytest.raises(ConnectionError, match="still alive"):
            lost.get(timeout=10)
        assert time.monotonic() - start < 5
        assert probe.ping.call_one("after").get(timeout=10) == "after"
        assert asyncio.run(on_a_loop()) == "loop"
    finally:
        pm.stop().get(timeout=10)
