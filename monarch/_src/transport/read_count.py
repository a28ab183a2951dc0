"""What the receiver of a connection tells its sender: how many frames it read.

A connection carries frames one way (``outgoing`` writes, ``connection`` reads); once the
handshake is done, the only bytes that go back are these fixed-size records, so that the sender
knows which frames it wrote were read, which the kernel alone cannot tell it: a TCP reset
discards the send queue of a live peer's connection, with frames the sender wrote long before.

* ``ACK``: the frames read on this connection so far (its hello not counted). The receiver sends
  one every ``ACK_FRAMES`` frames or ``ACK_BYTES`` bytes, which costs it a small write now and
  then; the sender forgets the frames it keeps for a resend up to that count.
* ``PREVIOUS``: on the connection that replaces one, the frames the receiver read of the one it
  replaces (once that one delivered all it carried, or ended), or ``UNKNOWN``. The sender sends
  the frames it wrote but the receiver never read, if it still keeps them, before anything else.

The records come from the authenticated peer, on the authenticated connection, after the
handshake, as the frames do the other way; anything else there ends the connection.
"""

from __future__ import annotations

import struct

#: A record: its kind, then a count.
RECORD = struct.Struct("!cQ")
ACK = b"a"
PREVIOUS = b"p"
#: In a ``PREVIOUS`` record: the receiver has no record of that connection (it never read its
#: hello, say), so which of its frames it read is unknown.
UNKNOWN = (1 << 64) - 1
#: The receiver acknowledges at least every this many frames, and this many bytes.
ACK_FRAMES = 512
ACK_BYTES = 1 << 20
