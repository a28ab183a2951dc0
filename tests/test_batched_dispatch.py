"""Many messages in flight to one sync actor: they reach its thread in batches (one per socket
read) and its replies go out corked, and still each call gets its own outcome, in order.

Edge cases of that batching: an exception in the middle of a batch, a blocking ``get()`` inside
an endpoint while the rest of its batch waits, 10,000 calls outstanding at once, and the
worker's process dying with a batch half done. Also the header templates calls and replies are
encoded from, and the frames of one call to every rank of a mesh, against the plain encoder.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import msgpack
import pytest
from actors import Pid
from helpers import wait_until

import monarch.actor
from monarch._src.actor.future import add_done_callback
from monarch._src.wire.frame import PREFIX, FrameTooLargeError, HeaderTemplate, encode_each, encode_frame
from monarch._src.wire.protocol import PORT_ID, REPLY_PORT, message, port_value
from monarch.actor import ActorError, SupervisionError, endpoint

N = 10_000


class Numbers(Pid):
    def __init__(self, other=None) -> None:
        self.ran: list[int] = []
        self.other = other

    @endpoint
    def echo(self, i: int) -> int:
        self.ran.append(i)
        return i

    @endpoint
    def fail_some(self, i: int) -> int:
        self.ran.append(i)
        if i % 97 == 13:
            raise ValueError(f"bad number {i}")
        return i

    @endpoint
    def relay(self, i: int) -> int:
        """Blocks its thread on a call to another actor while later messages wait."""
        self.ran.append(i)
        return self.other.echo.call_one(i).get(timeout=30) if i % 10 == 0 else i

    @endpoint
    def die_at(self, i: int, at: int) -> int:
        if i == at:
            os._exit(3)
        return i

    @endpoint
    def order(self) -> list[int]:
        return list(self.ran)


def _arrival_order(futures: list) -> Callable[[], list[int]]:
    """The indexes of ``futures`` in the order they were resolved (on the client's loop), read
    once every one was recorded: a waiting ``get()`` may return before the done-callbacks ran."""
    seen: list[int] = []
    lock = threading.Lock()
    for i, f in enumerate(futures):

        def done(_: object, i: int = i) -> None:
            with lock:
                seen.append(i)

        add_done_callback(f, done)
    return lambda: wait_until(lambda: len(seen) == len(futures) and seen, timeout=30, what="every callback")


@pytest.mark.timeout(120)
def test_10k_outstanding_calls_all_answered_in_order(procs1) -> None:
    actor = procs1.spawn("numbers", Numbers)
    futures = [actor.echo.call_one(i) for i in range(N)]
    arrived = _arrival_order(futures)
    assert [f.get(timeout=60) for f in futures] == list(range(N))
    assert arrived() == list(range(N)), "replies of one actor to one caller arrive in the order sent"
    assert actor.order.call_one().get(timeout=30) == list(range(N)), "run in the order sent"


@pytest.mark.timeout(120)
def test_an_exception_mid_batch_fails_only_its_own_call(procs1) -> None:
    actor = procs1.spawn("numbers", Numbers)
    n = 3000
    futures = [actor.fail_some.call_one(i) for i in range(n)]
    for i, f in enumerate(futures):
        if i % 97 == 13:
            with pytest.raises(ActorError, match=f"bad number {i}"):
                f.get(timeout=60)
        else:
            assert f.get(timeout=60) == i
    assert actor.order.call_one().get(timeout=30) == list(range(n)), (
        "nothing after a failure lost or reordered"
    )
    assert actor.echo.call_one(-1).get(timeout=30) == -1, "the actor lives on"


@pytest.mark.timeout(120)
def test_a_blocking_get_inside_an_endpoint_while_its_batch_waits(procs2) -> None:
    helpers = procs2.slice(gpus=1).spawn("helper", Numbers)
    actor = procs2.slice(gpus=0).spawn("relay", Numbers, helpers)
    n = 2000
    futures = [actor.relay.call_one(i) for i in range(n)]
    arrived = _arrival_order(futures)
    assert [f.get(timeout=60) for f in futures] == list(range(n))
    assert arrived() == list(range(n))
    assert actor.order.call_one().get(timeout=30) == list(range(n))
    assert helpers.order.call_one().get(timeout=30) == list(range(0, n, 10))


@pytest.mark.timeout(120)
def test_the_process_dying_mid_batch_answers_every_call(monkeypatch, procs1) -> None:
    faults: list[str] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", lambda f: faults.append(str(f)))
    actor = procs1.spawn("numbers", Numbers)
    at = N // 2
    futures = [actor.die_at.call_one(i, at) for i in range(N)]
    answered: list[int] = []
    failed: list[int] = []
    for i, f in enumerate(futures):
        try:
            assert f.get(timeout=60) == i
            answered.append(i)
        except SupervisionError:
            failed.append(i)
    # Replies corked when the process died are lost with it: those calls fail too, and what
    # was answered is a prefix of what was sent, up to the call that killed it.
    assert answered == list(range(len(answered))) and len(answered) <= at
    assert failed == list(range(len(answered), N))
    wait_until(lambda: faults, what="the client's fault hook to hear of the process's death")
    assert len(faults) == 1 and "numbers" in faults[0], faults


def _decoded(buffers: list) -> tuple[dict, bytes]:
    frame = b"".join(bytes(b) for b in buffers)
    (hlen,) = PREFIX.unpack_from(frame)
    return msgpack.unpackb(frame[PREFIX.size : PREFIX.size + hlen]), frame[PREFIX.size + hlen :]


@pytest.mark.parametrize("size", [0, 10, 64 * 1024])
def test_a_templated_header_is_the_header_built_whole(size: int) -> None:
    body = os.urandom(size)
    reply = ["unix:/tmp/some.sock", 12345]
    whole = encode_frame(message("key", "echo", reply, 3, [["gpus"], [4]]), [body], 1 << 30)
    template = HeaderTemplate(message("key", "echo", None, 3, [["gpus"], [4]]), REPLY_PORT)
    assert _decoded(template.encode(reply, [body], 1 << 30)) == _decoded(whole)
    assert template.header(reply) | {"b": [size]} == _decoded(whole)[0]
    value = HeaderTemplate(port_value(0, 2, 0), PORT_ID)
    assert _decoded(value.encode(77, [body, body], 1 << 30)) == _decoded(
        encode_frame(port_value(77, 2, 0), [body, body], 1 << 30)
    )
    with pytest.raises(FrameTooLargeError):
        template.encode(reply, [body + b"x" * 200], 200)


@pytest.mark.parametrize("size", [0, 10, 4000])
def test_the_frames_of_a_call_to_each_rank_are_the_frames_built_whole(size: int) -> None:
    """A small call to several ranks shares one encoding of its reply port and body: each
    rank's frame still decodes to its own header (its rank) and the same body."""
    body = os.urandom(size)
    reply = ["unix:/tmp/some.sock", 12345]
    extent = [["hosts", "gpus"], [2, 2]]
    templates = [HeaderTemplate(message("key", "echo", None, r, extent), REPLY_PORT) for r in range(4)]
    frames = encode_each(templates, reply, body, 1 << 30)
    assert frames is not None and len(frames) == 4
    for rank, frame in enumerate(frames):
        assert len(frame) == 1  # one buffer per small frame
        whole = encode_frame(message("key", "echo", reply, rank, extent), [body], 1 << 30)
        assert _decoded(frame) == _decoded(whole)
        assert _decoded(frame)[0]["r"] == rank


def test_a_call_to_each_rank_too_large_to_share_an_encoding_is_left_to_the_caller() -> None:
    """Over the one-buffer size, or over the frame limit, nothing is encoded together (None):
    the caller encodes each frame on its own, where the limit raises."""
    templates = [
        HeaderTemplate(message("key", "echo", None, r, [["gpus"], [2]]), REPLY_PORT) for r in range(2)
    ]
    assert encode_each(templates, ["a", 1], os.urandom(64 * 1024), 1 << 30) is None
    assert encode_each(templates, ["a", 1], b"x" * 300, 200) is None
    with pytest.raises(FrameTooLargeError):
        templates[0].encode(["a", 1], [b"x" * 300], 200)
