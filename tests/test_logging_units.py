"""The pieces of log forwarding that need no processes: aggregation, the writer, level parsing."""

from __future__ import annotations

import io
import logging
import sys
import threading
import time

import pytest

from monarch._src.actor import log_prefix
from monarch._src.actor.log_aggregator import MAX_GROUPS, Aggregator, similarity_key
from monarch._src.actor.log_forwarding import CONTROL_MARK
from monarch._src.host.log_capture import _hold_control_start
from monarch._src.runtime import framework_log
from monarch._src.runtime.output_writer import OutputWriter

pytestmark = pytest.mark.timeout(30)


def test_lines_differing_only_in_numbers_are_similar() -> None:
    assert similarity_key("step 9 loss=0.25") == similarity_key("step 10 loss=1.5e-3")
    assert similarity_key("at 0x7ffd1234") == similarity_key("at 0xdeadbeef")
    assert similarity_key("step 9 loss") != similarity_key("step 9 acc")


def test_a_window_collapses_groups_in_order_of_appearance_per_stream() -> None:
    agg = Aggregator()
    agg.add_text(1, "step 1 loss=0.5\nhello\nstep 2 loss=0.4\n")
    agg.add_text(1, "step 3 loss=0.3\n", prefix="[gpus=1] ")
    agg.add_text(2, "warning 7\nwarning 8\n")
    agg.add(1, "hello")
    assert agg.lines == 7
    out = agg.drain()
    assert out[1].splitlines() == [
        "[2 similar log lines] step 1 loss=0.5",
        "[2 similar log lines] hello",
        "[gpus=1] step 3 loss=0.3",
    ]
    assert out[2] == "[2 similar log lines] warning 7\n"
    assert agg.drain() == {} and len(agg) == 0


def test_ranks_prefixes_with_different_numbers_still_group() -> None:
    agg = Aggregator()
    for rank in range(4):
        agg.add_text(1, "ready\n", prefix=f"[gpus={rank}] ")
    assert agg.drain() == {1: "[4 similar log lines] [gpus=0] ready\n"}


def test_an_aggregator_reports_full_before_memory_grows() -> None:
    agg = Aggregator()
    agg.add_text(
        1,
        "".join(
            f"distinct line {chr(65 + i % 26)}{chr(65 + i // 26 % 26)}{chr(65 + i // 676)}\n"
            for i in range(MAX_GROUPS)
        ),
    )
    assert agg.full


def test_writer_refuses_when_full_and_runs_callbacks_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()

    class Slow(io.StringIO):
        def write(self, s: str) -> int:
            gate.wait(10)
            return super().write(s)

    sink = Slow()
    monkeypatch.setattr(sys, "stdout", sink)
    w = OutputWriter("stdout", max_pending=100)
    assert w.write("a" * 60 + "\n")
    deadline = time.monotonic() + 5
    while w.pending and w._items:  # the writer thread took the first item and is stuck in it
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert w.write("b" * 30 + "\n")
    assert not w.write("c" * 30 + "\n")  # 61 + 31 + 31 > 100: refused, not queued
    assert w.write("d\n", force=True)
    order: list[str] = []
    w.call_after(lambda: order.append(sink.getvalue()))
    gate.set()
    assert w.flush(5)
    assert order == ["a" * 60 + "\n" + "b" * 30 + "\n" + "d\n"]


def test_control_line_start_is_held_back_from_partial_output() -> None:
    assert _hold_control_start(b"progress 10%") == (b"progress 10%", b"")
    assert _hold_control_start(b"abc" + CONTROL_MARK[:4]) == (b"abc", CONTROL_MARK[:4])
    assert _hold_control_start(b"abc" + CONTROL_MARK + b'{"op"') == (b"abc", CONTROL_MARK + b'{"op"')
    assert _hold_control_start(b"a\x1eb") == (b"a\x1eb", b"")


def test_level_names(monkeypatch: pytest.MonkeyPatch) -> None:
    problems: list[str] = []
    for raw, want in [("trace", 5), ("DEBUG", 10), ("info", 20), ("WARN", 30), ("ERROR", 40), ("", 20)]:
        monkeypatch.setenv("MONARCH_FILE_LOG", raw)
        assert framework_log.parse_level("MONARCH_FILE_LOG", logging.INFO, problems) == want
    assert problems == []
    monkeypatch.setenv("MONARCH_FILE_LOG", "chatty")
    assert framework_log.parse_level("MONARCH_FILE_LOG", logging.INFO, problems) == logging.INFO
    assert (
        len(problems) == 1
        and "MONARCH_FILE_LOG='chatty'" in problems[0]
        and "TRACE, DEBUG, INFO, WARN, ERROR" in problems[0]
    )


def test_actor_prefix_keeps_percent_formatting() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d%% done", (50,), None)
    log_prefix.prefixed(record, "a%b")
    assert record.getMessage() == "[actor=a%b] 50% done"
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "", None, None)
    log_prefix.prefixed(record, "a")
    assert record.getMessage() == ""
