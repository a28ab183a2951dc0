"""Per sender/receiver FIFO delivery across adverbs, ports and senders."""

from __future__ import annotations

import threading

import pytest

from monarch.actor import Actor, Channel, endpoint, send, this_proc

N = 3000


class Log(Actor):
    def __init__(self) -> None:
        self.log: list = []

    @endpoint
    def append(self, item) -> int:
        self.log.append(item)
        return len(self.log)

    @endpoint
    def get(self) -> list:
        return list(self.log)


class Sender(Actor):
    @endpoint
    def blast(self, target, n: int) -> int:
        for i in range(n):
            if i % 2:
                target.append.broadcast(("s", i))
            else:
                send(target.append, (("s", i),), {})
        # FIFO from this sender: once this reply arrives, all of the above were handled.
        return target.append.call_one(("s", n)).get(timeout=30)


def _mixed_sends(log, n: int) -> tuple[list, object]:
    port, receiver = Channel.open()
    futures = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            log.append.broadcast(i)
        elif kind == 1:
            futures.append(log.append.call_one(i))
        else:
            send(log.append, (i,), {}, port=port)
    return futures, receiver


@pytest.mark.parametrize("where", ["worker", "client"])
def test_fifo_across_adverbs(procs1, where):
    log = procs1.spawn("log", Log) if where == "worker" else this_proc().spawn("log", Log)
    try:
        futures, receiver = _mixed_sends(log, N)
        assert log.get.call_one().get(timeout=30) == list(range(N))
        positions = [f.get(timeout=10) for f in futures]
        assert positions == sorted(positions)  # replies reflect the order of arrival
        port_positions = [receiver.recv().get(timeout=10) for _ in range(N // 3)]
        assert port_positions == sorted(port_positions)
    finally:
        if where == "client":
            log.stop().get(timeout=10)


def test_fifo_per_sender_with_two_senders(procs2):
    log = procs2.spawn("log", Log).slice(gpus=0)
    sender = procs2.spawn("sender", Sender).slice(gpus=1)
    n = 1000
    done = sender.blast.call_one(log, n)
    for i in range(n):
        log.append.broadcast(("c", i))
    done.get(timeout=30)
    entries = log.get.call_one().get(timeout=30)
    assert len(entries) == 2 * n + 1
    assert [i for who, i in entries if who == "c"] == list(range(n))
    assert [i for who, i in entries if who == "s"] == list(range(n + 1))


def test_fifo_per_client_thread_and_replies_matched(procs1):
    log = procs1.spawn("log", Log)
    n, threads_n = 400, 4
    errors: list = []
    barrier = threading.Barrier(threads_n)

    def client_thread(t: int) -> None:
        try:
            barrier.wait(10)
            futures = []
            for i in range(n):
                if i % 2:
                    log.append.broadcast((t, i))
                else:
                    futures.append(log.append.call_one((t, i)))
            positions = [f.get(timeout=30) for f in futures]
            assert positions == sorted(positions)
        except BaseException as e:  # asserted below
            errors.append(e)

    threads = [threading.Thread(target=client_thread, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == []
    entries = log.get.call_one().get(timeout=30)
    assert len(entries) == n * threads_n
    for t in range(threads_n):
        assert [i for who, i in entries if who == t] == list(range(n))
