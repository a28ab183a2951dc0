"""The pure-Python TCPStore server the launcher hosts for its workers."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import textwrap

import pytest

from monarch._src.launch.store import VALIDATE_MAGIC, StoreServer


def _client(port: int, body: str, timeout: float = 60) -> str:
    """Run torch's own TCPStore client against the server, in a separate process."""
    pytest.importorskip("torch")
    code = (
        "import datetime, torch.distributed as dist\n"
        + (
            f"c = dist.TCPStore('localhost', {port}, is_master=False, timeout=datetime.timedelta(seconds=10))\n"
        )
        + textwrap.dedent(body)
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_torch_client_operations():
    with StoreServer("localhost", 0) as store:
        out = _client(
            store.port,
            """
            import datetime
            c.set("a", b"1"); print(c.get("a"))
            print(c.add("n", 3), c.add("n", 4))
            print(c.compare_set("a", b"1", b"2"), c.compare_set("a", b"x", b"3"), c.get("a"))
            print(c.check(["a"]), c.check(["nope"]))
            try:
                c.wait(["nope"], datetime.timedelta(milliseconds=300))
            except Exception as e:
                print("timeout", type(e).__name__)
            c.set("nope", b"here"); c.wait(["nope"]); print("waited")
            print(c.delete_key("nope"), c.delete_key("nope"))
            c.append("ap", b"x"); c.append("ap", b"y"); print(c.get("ap"))
            c.multi_set(["m1", "m2"], [b"1", b"2"]); print(c.multi_get(["m1", "m2"]))
            c.queue_push("q", b"v1"); c.queue_push("q", b"v2"); print(c.queue_len("q"), c.queue_pop("q"), c.queue_len("q"))
            print(sorted(c.list_keys()), c.num_keys())
            c.barrier("b", 1); print("barrier")
            """,
        )
    assert out.split("\n") == [
        "b'1'",
        "3 7",
        "b'2' b'2' b'2'",
        "True False",
        "timeout DistStoreError",
        "waited",
        "True False",
        "b'xy'",
        "[b'1', b'2']",
        "2 b'v1' 1",
        "['a', 'ap', 'm1', 'm2', 'n'] 5",
        "barrier",
        "",
    ]


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_waiting_client_is_woken_by_another():
    with StoreServer("127.0.0.1", 0) as store:
        waiter = subprocess.Popen(
            [
                sys.executable,
                "-c",
                (
                    "import datetime, torch.distributed as dist\n"
                    f"c = dist.TCPStore('127.0.0.1', {store.port}, is_master=False, timeout=datetime.timedelta(seconds=30))\n"
                    "c.set('waiting', b'1'); print(c.get('key'))\n"
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            _client(
                store.port,
                """
                import time
                c.wait(["waiting"])
                c.set("key", b"value")
                """,
            )
            out, _ = waiter.communicate(timeout=30)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        assert out.strip() == "b'value'"


def _raw(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"\x00" + struct.pack("<I", VALIDATE_MAGIC))
    return s


def test_malformed_input_closes_only_that_connection():
    with StoreServer("127.0.0.1", 0) as store:
        good = _raw(store.port)
        bad = socket.create_connection(("127.0.0.1", store.port), timeout=5)
        bad.sendall(b"\x01" + b"\x00" * 16)  # a command before validation
        assert bad.recv(1) == b""  # closed by the server
        huge = _raw(store.port)
        huge.sendall(b"\x03" + struct.pack("<Q", 1 << 40))  # a key length over the limit
        assert huge.recv(1) == b""
        # The good connection still works: SET then GET.
        key, value = b"k", b"v"
        good.sendall(b"\x01" + struct.pack("<Q", 1) + key + struct.pack("<Q", 1) + value)
        good.sendall(b"\x03" + struct.pack("<Q", 1) + key)
        assert good.recv(9) == struct.pack("<Q", 1) + value
        for s in (good, bad, huge):
            s.close()


def test_fresh_store_per_port_and_fixed_port_reuse():
    with StoreServer("127.0.0.1", 0) as first:
        port = first.port
    with StoreServer("127.0.0.1", port) as again:  # a restart on a fixed --master-port
        assert again.port == port
        assert again.data == {}
