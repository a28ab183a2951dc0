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
#: A frame up to this size is encoded as one buffer: copying a few small pieces together costs
#: less than the writer's bookkeeping of each (and the kernel's iovec per piece).
JOIN_BYTES = 8 * 1024

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

    The bodies of a large frame are not copied; ``header`` gains the body lengths.
    """
    lengths = [len(b) if type(b) is bytes else memoryview(b).nbytes for b in bodies]
    header[BODY_LENGTHS] = lengths
    return _buffers(_pack(header), lengths, bodies, max_frame_bytes)


def _buffers(head: bytes, lengths: list[int], bodies: Sequence[Any], max_frame_bytes: int) -> list[Any]:
    total = len(head) + sum(lengths)
    if total > max_frame_bytes:
        raise FrameTooLargeError(total, max_frame_bytes, "sending")
    if total <= JOIN_BYTES:
        return [b"".join((PREFIX.pack(len(head)), head, *bodies))]
    return [PREFIX.pack(len(head)), head, *bodies]


class HeaderTemplate:
    """The headers of many frames alike, which differ only in one entry (``varying``).

    A sender of such frames (calls to one endpoint of one actor, replies of one rank) packs the
    shared entries once; a frame then costs one pack of the varying value and one of the body
    lengths instead of building and packing a whole map. The receiver decodes the same map as
    from ``encode_frame`` (msgpack does not care about the order of a map's entries).
    """

    __slots__ = ("_fixed", "varying", "_head", "_lengths_key")

    def __init__(self, header: dict[str, Any], varying: str) -> None:
        self._fixed = {k: v for k, v in header.items() if k != varying and k != BODY_LENGTHS}
        #: The key of the entry that differs between the frames.
        self.varying = varying
        entries = len(self._fixed) + 2  # and the varying one, and the body lengths
        assert entries < 16, "a template's header must fit a msgpack fixmap"
        packed = b"".join(_pack(k) + _pack(v) for k, v in self._fixed.items())
        self._head = bytes([0x80 | entries]) + packed + _pack(varying)
        self._lengths_key = _pack(BODY_LENGTHS)

    def header(self, value: Any) -> dict[str, Any]:
        """The header as a dict, for a frame that is not encoded from the template."""
        header = dict(self._fixed)
        header[self.varying] = value
        return header

    def encode(self, value: Any, bodies: Sequence[Any], max_frame_bytes: int) -> list[Any]:
        """``encode_frame(self.header(value), bodies, max_frame_bytes)``, for less."""
        if len(bodies) == 1:  # most messages: one pickle stream
            body = bodies[0]
            n = len(body) if type(body) is bytes else memoryview(body).nbytes
            head = self._head + _pack(value) + self._lengths_key + _pack([n])
            if len(head) + n <= JOIN_BYTES and len(head) + n <= max_frame_bytes:
                return [PREFIX.pack(len(head)) + head + body]
            return _buffers(head, [n], bodies, max_frame_bytes)  # large, or too large
        lengths = [len(b) if type(b) is bytes else memoryview(b).nbytes for b in bodies]
        head = self._head + _pack(value) + self._lengths_key + _pack(lengths)
        return _buffers(head, lengths, bodies, max_frame_bytes)


def header_of(buffers: Sequence[Any]) -> dict[str, Any]:
    """The header of a frame encoded here (``encode_frame``, ``HeaderTemplate.encode``), from
    its buffers: the prefix and header lead the first buffer, or are the first two."""
    first = memoryview(buffers[0]).cast("B")
    (hlen,) = PREFIX.unpack_from(first)
    head = first[PREFIX_SIZE : PREFIX_SIZE + hlen] if len(first) > PREFIX_SIZE else buffers[1]
    return decode_header(head)


def encode_each(
    templates: Sequence[HeaderTemplate], value: Any, body: Any, max_frame_bytes: int
) -> list[list[Any]] | None:
    """``[t.encode(value, [body], max_frame_bytes) for t in templates]`` for one message to
    several destinations (a mesh call: each template differs in the rank only), where its
    frames are small: what they share (the varying value, the body's length, the body) is
    packed once, and each frame costs one join. None when a frame would not be small: the
    caller encodes each one on its own then (``encode`` checks the size limit)."""
    if not templates:
        return []
    n = len(body) if type(body) is bytes else memoryview(body).nbytes
    tail = _pack(value) + templates[0]._lengths_key + _pack([n])
    tail_size = len(tail)
    limit = min(JOIN_BYTES, max_frame_bytes) - n - tail_size  # for the header's fixed part
    frames = []
    for t in templates:
        head = t._head
        if len(head) > limit:
            return None
        frames.append([b"".join((PREFIX.pack(len(head) + tail_size), head, tail, body))])
    return frames


def decode_header(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decode a header received on an authenticated connection; raise FrameError if malformed."""
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated exception types
        raise FrameError(f"malformed frame header: {e}") from None
    if type(header) is not dict:
        raise FrameError("malformed frame header: not a map")
    lengths = header.get(BODY_LENGTHS)
    if type(lengths) is not list:
        raise FrameError("malformed frame header: bad body lengths")
    for n in lengths:
        if type(n) is not int or n < 0:
            raise FrameError("malformed frame header: bad body lengths")
    return header
