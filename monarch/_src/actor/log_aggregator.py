"""Collapsing similar output lines within a time window (pure data, no I/O, no timers).

Two lines are similar when they are equal after every number in them is replaced by a
placeholder: ``step 10 loss=0.25`` and ``step 11 loss=0.19`` are one group. At the end of a
window each group becomes one line, ``[N similar log lines] <first line of the group>``, or
the line itself when the group has a single line. Groups come out in the order they started,
per stream (stdout lines stay on stdout, stderr lines on stderr).
"""

from __future__ import annotations

import re
from collections import Counter

#: Hex literals, then decimal numbers with optional sign, fraction and exponent.
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
#: Distinct groups, and characters of their first lines, one window may hold; beyond either
#: the window should be closed early (memory stays bounded whatever the workers print).
MAX_GROUPS = 4096
MAX_CHARS = 4 << 20


def similarity_key(line: str) -> str:
    return _NUMBER.sub("\x00", line)


def summary_line(count: int, line: str) -> str:
    return line if count == 1 else f"[{count} similar log lines] {line}"


class Aggregator:
    """The groups of one window; ``drain`` closes the window and returns its output."""

    __slots__ = ("_groups", "lines", "chars")

    def __init__(self) -> None:
        #: (stream, similarity key) -> [count, first line]; dicts keep insertion order.
        self._groups: dict[tuple[int, str], list] = {}
        #: Lines added since the last drain.
        self.lines = 0
        #: Characters held (the first line of every group).
        self.chars = 0

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def full(self) -> bool:
        return len(self._groups) >= MAX_GROUPS or self.chars >= MAX_CHARS

    def add(self, stream: int, line: str) -> None:
        key = (stream, _NUMBER.sub("\x00", line))
        group = self._groups.get(key)
        if group is None:
            self._groups[key] = [1, line]
            self.chars += len(line)
        else:
            group[0] += 1
        self.lines += 1

    def add_text(self, stream: int, text: str, prefix: str = "") -> None:
        """Add the newline-separated lines of ``text`` (each given ``prefix``).

        The whole batch goes through the number pattern in one call and is counted with C
        loops (``Counter``, dict construction), which keeps the client cheap under a flood.
        """
        body = text[:-1] if text.endswith("\n") else text
        if not body and not text:
            return
        lines = body.split("\n")
        keys = _NUMBER.sub("\x00", body).split("\n")
        if prefix:
            key_prefix = _NUMBER.sub("\x00", prefix)
            lines = [prefix + line for line in lines]
            keys = [key_prefix + key for key in keys]
        counts = Counter(keys)
        groups = self._groups
        if len(counts) == 1:
            key = (stream, keys[0])
            group = groups.get(key)
            if group is None:
                groups[key] = [len(keys), lines[0]]
                self.chars += len(lines[0])
            else:
                group[0] += len(keys)
        else:
            first = dict(zip(reversed(keys), reversed(lines)))  # the first line of each key wins
            for k in dict.fromkeys(keys):  # in order of first appearance
                group = groups.get((stream, k))
                if group is None:
                    groups[(stream, k)] = [counts[k], first[k]]
                    self.chars += len(first[k])
                else:
                    group[0] += counts[k]
        self.lines += len(keys)

    def drain(self) -> dict[int, str]:
        """Close the window: stream -> the text to write (newline-terminated lines)."""
        out: dict[int, list[str]] = {}
        for (stream, _), (count, line) in self._groups.items():
            out.setdefault(stream, []).append(summary_line(count, line))
        self._groups = {}
        self.lines = 0
        self.chars = 0
        return {stream: "\n".join(lines) + "\n" for stream, lines in out.items()}
