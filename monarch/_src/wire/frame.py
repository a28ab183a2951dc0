"""Frame format shared by every connection.

A frame is ``<u32 header length> <msgpack header> <body 0> <body 1> ...``. The header is a
small msgpack map the router can read without touching the bodies; it carries the byte length
of every body under the key ``"b"``. Body 0 is the pickle stream of the payload, the others are
its out-of-band buffers, so a large array is written straight from its own memory and read
straight into its final buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack

from monarch._src.wire.protocol import BODY_LENGTHS

PREFIX = struct.Struct("<I")
PREFIX_SIZE = PREFIX.size

#: Headers are tiny (ids, an endpoint name, a few ranks); anything bigger is malformed.
MAX_HEADER_BYTES = 1 << 20

_pack = msgpack.Packer(use_bin_type=True).pack


class FrameError(Exception):
    """A frame that cannot be sent or was received malformed."""


class FrameTooLargeError(FrameError, ValueError):
    """A frame exceeds the configured maximum size (on the sending or the receiving side)."""

    def __init__(self, length: int, limit: int, side: str) -> None:
        super().__init__(
            f"rejecting oversize frame: len={length} > max={limit} ({side} side)\n"
            "HINT: send large data in smaller pieces, or raise the limit on both sides: "
            "monarch.config.configure(codec_max_frame_length=N) in the client before it starts "
            "(processes it spawns afterwards inherit it), or MONARCH_MAX_FRAME_BYTES=N in the "
            "environment."
        )
        self.length = length
        self.limit = limit
        self.side = side

    def __reduce__(self) -> Any:
        return (FrameTooLargeError, (self.length, self.limit, self.side))


def encode_frame(header: dict[str, Any], bodies: Sequence[Any], max_frame_bytes: int) -> list[Any]:
    """Return the buffers of one frame, ready for ``transport.writelines``.

    The bodies are not copied; ``header`` gains the body lengths.
    """
    lengths = [len(b) if type(b) is bytes else memoryview(b).nbytes for b in bodies]
    header[BODY_LENGTHS] = lengths
    head = _pack(header)
    total = len(head) + sum(lengths)
    if total > max_frame_bytes:
        raise FrameTooLargeError(total, max_frame_bytes, "sending")
    return [PREFIX.pack(len(head)), head, *bodies]


def decode_header(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decode a header received on an authenticated connection; raise FrameError if malformed."""
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated exception types
        raise FrameError(f"malformed frame header: {e}") from None
    if not isinstance(header, dict):
        raise FrameError("malformed frame header: not a map")
    lengths = header.get(BODY_LENGTHS)
    if type(lengths) is not list:
        raise FrameError("malformed frame header: bad body lengths")
    for n in lengths:
        if type(n) is not int or n < 0:
            raise FrameError("malformed frame header: bad body lengths")
    return header
