"""Running out of memory while reading a message reaches the caller; the receiver lives on.

The worker's address space is capped (RLIMIT_AS, set from outside with prlimit) just above
what it uses, and a call carries a 100 MB string (in the pickle stream, so through the socket,
not shared memory): allocating its buffer fails in the receiver, which skips the message and
answers the caller with the MemoryError.
"""

from __future__ import annotations

import psutil
import pytest
from fault_helpers import probe_worker

HEADROOM = 40 << 20


@pytest.mark.timeout(60)
def test_memory_error_while_reading_reaches_the_caller():
    with probe_worker() as (probe, pid, _):
        worker = psutil.Process(pid)
        before = worker.rlimit(psutil.RLIMIT_AS)
        worker.rlimit(psutil.RLIMIT_AS, (worker.memory_info().vms + HEADROOM, before[1]))
        try:
            with pytest.raises(MemoryError) as info:
                probe.length.call_one("x" * 100_000_000).get(timeout=20)
        finally:
            worker.rlimit(psutil.RLIMIT_AS, before)
        message = str(info.value)
        assert f"pid {pid}" in message and "ran out of memory" in message and "HINT" in message, message
        assert probe.length.call_one("still here").get(timeout=10) == 10
