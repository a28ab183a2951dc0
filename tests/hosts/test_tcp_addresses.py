"""Proc addresses: ``tcp:<host>:<port>`` (IPv6 hosts in brackets) next to ``unix:<path>``, parsed
in one place, with an error that shows the accepted forms; IPv6 works end to end."""

from __future__ import annotations

import socket

import pytest
from tcp_helpers import Where, tcp_procs

from monarch._src.transport.address import TcpAddress, UnixAddress, parse


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("unix:/tmp/job/1-1.sock", UnixAddress("/tmp/job/1-1.sock")),
        ("tcp:127.0.0.1:4000", TcpAddress("127.0.0.1", 4000)),
        ("tcp:[::1]:4000", TcpAddress("::1", 4000)),
        ("tcp:[fe80::1%eth0]:65535", TcpAddress("fe80::1%eth0", 65535)),
        ("tcp:node-7.cluster:22222", TcpAddress("node-7.cluster", 22222)),
    ],
)
def test_addresses_parse_and_format_back(text: str, parsed: object) -> None:
    assert parse(text) == parsed
    assert str(parsed) == text


@pytest.mark.parametrize(
    "text, why",
    [
        ("tcp:127.0.0.1", "no port"),
        ("tcp::4000", "no host"),
        ("tcp:127.0.0.1:http", "is not a number"),
        ("tcp:127.0.0.1:70000", "is not a number from 1 to 65535"),
        ("tcp:::1:4000", "IPv6 host must be written in brackets"),
        ("tcp:[::1]4000", "must be followed by ]:<port>"),
        ("udp:127.0.0.1:4000", "unknown transport"),
        ("unix:", "no socket path"),
    ],
)
def test_bad_addresses_say_what_is_wrong_and_what_is_accepted(text: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        parse(text)
    assert why in str(info.value) and "HINT: proc addresses look like" in str(info.value)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
@pytest.mark.timeout(60)
def test_proc_listening_on_ipv6_loopback_is_reached_at_its_bracketed_address() -> None:
    with tcp_procs(bind_host="::1") as pm:
        where = pm.spawn("where", Where)
        _, address = where.where.call_one().get(timeout=30)
        assert address.startswith("tcp:[::1]:")
        assert where.echo.call_one(b"x" * (2 << 20)).get(timeout=10) == b"x" * (2 << 20)


def test_listener_on_every_interface_is_named_by_the_host_name() -> None:
    from monarch._src.transport.address import listen_tcp, of_listening_socket

    with listen_tcp("0.0.0.0") as sock:
        assert of_listening_socket(sock) == f"tcp:{socket.gethostname()}:{sock.getsockname()[1]}"
