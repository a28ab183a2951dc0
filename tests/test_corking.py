"""Bursts of sends are batched (corked) by the sending thread, yet always delivered promptly."""

from __future__ import annotations

from helpers import wait_until

from monarch.actor import Actor, endpoint

N = 400


class Tally(Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def note(self, i: int) -> None:
        with open(self.path, "a") as f:
            f.write(f"{i}\n")


def _lines(path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def test_a_burst_arrives_in_order_without_any_blocking_wait(procs1, tmp_path):
    out = tmp_path / "tally.txt"
    tally = procs1.spawn("tally", Tally, str(out))
    for i in range(N):  # back to back: corked after the first
        tally.note.broadcast(i)
    # No get(): nothing in this thread flushes, so the runtime's loop must write the burst.
    wait_until(lambda: len(_lines(out)) >= N, 20, f"{N} notes in {out}")
    assert _lines(out) == [str(i) for i in range(N)]


def test_a_burst_then_a_call_sees_every_earlier_message(procs1, tmp_path):
    out = tmp_path / "tally.txt"
    tally = procs1.spawn("tally", Tally, str(out))
    for i in range(N):
        tally.note.broadcast(i)
    tally.note.call_one(N).get(timeout=20)  # FIFO: handled after all of the burst
    assert _lines(out) == [str(i) for i in range(N + 1)]


async def test_a_burst_awaited_from_async_code_arrives_in_order(procs1, tmp_path):
    import asyncio

    tally = procs1.spawn("tally", Tally, str(tmp_path / "tally.txt"))
    calls = [tally.note.call_one(i) for i in range(N)]  # corked in this (the event loop's) thread
    await asyncio.wait_for(asyncio.gather(*calls), timeout=20)
    assert _lines(tmp_path / "tally.txt") == [str(i) for i in range(N)]
