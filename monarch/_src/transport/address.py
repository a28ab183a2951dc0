"""Proc addresses: the one place that parses and formats them, and binds listening sockets.

A proc address is a string, so that references pickle small and compare fast:

- ``unix:<path>``: a Unix socket, reachable only from processes of the same host (the same
  kernel), which is why such peers may also share buffers through ``/dev/shm``;
- ``tcp:<host>:<port>``: a TCP socket, ``tcp:127.0.0.1:4000`` or ``tcp:[::1]:4000`` (an IPv6
  host in brackets) or a host name. A TCP peer is treated as another host whatever its
  address: messages to it carry every byte inline, never a shared-memory file name.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

UNIX_PREFIX = "unix:"
TCP_PREFIX = "tcp:"
#: Connections a listening socket queues before it accepts them.
LISTEN_BACKLOG = 1024
#: Bind hosts meaning "every interface": the address then names this machine by its host name.
_WILDCARD_HOSTS = {"", "0.0.0.0", "::"}


@dataclass(frozen=True)
class UnixAddress:
    path: str

    def __str__(self) -> str:
        return UNIX_PREFIX + self.path


@dataclass(frozen=True)
class TcpAddress:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{TCP_PREFIX}{host}:{self.port}"


Address = UnixAddress | TcpAddress


def _bad(address: str, why: str) -> ValueError:
    return ValueError(
        f"bad proc address {address!r}: {why}\n"
        "HINT: proc addresses look like unix:/path/to/socket, tcp:10.0.0.5:4000 or tcp:[::1]:4000"
    )


def parse(address: str) -> Address:
    """The address ``address`` names; ValueError (saying what is accepted) if it names none."""
    if address.startswith(UNIX_PREFIX):
        path = address[len(UNIX_PREFIX) :]
        if not path:
            raise _bad(address, "no socket path")
        return UnixAddress(path)
    if not address.startswith(TCP_PREFIX):
        raise _bad(address, "unknown transport")
    rest = address[len(TCP_PREFIX) :]
    if rest.startswith("["):
        host, bracket, port = rest[1:].partition("]:")
        if not bracket:
            raise _bad(address, "an IPv6 host must be followed by ]:<port>")
    else:
        host, colon, port = rest.rpartition(":")
        if not colon:
            raise _bad(address, "no port")
        if ":" in host:
            raise _bad(address, "an IPv6 host must be written in brackets")
    if not host:
        raise _bad(address, "no host")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(address, f"port {port!r} is not a number from 1 to 65535")
    return TcpAddress(host, int(port))


def is_unix(address: str) -> bool:
    """Whether ``address`` is a Unix socket, hence a process of this host (cheap: hot path)."""
    return address.startswith(UNIX_PREFIX)


def is_loopback(address: str) -> bool:
    """Whether only this machine can reach ``address``: a Unix socket, or TCP on a loopback
    address (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    parsed = parse(address)
    if isinstance(parsed, UnixAddress):
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(parsed.host).is_loopback
    except ValueError:
        return parsed.host == "localhost"


def address_toward(peer: str) -> str:
    """This machine's address on the route to ``peer`` (an address or a name): where a process
    here listens to be reachable from there. A UDP connect sends nothing."""
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))
        return str(probe.getsockname()[0])


#: ioctl that reads an interface's IPv4 address (linux/sockios.h).
_SIOCGIFADDR = 0x8915


def interface_of(host: str) -> str | None:
    """The name of this machine's network interface that holds address ``host`` (what a library
    that binds by interface, such as gloo's ``GLOO_SOCKET_IFNAME``, needs); None if ``host`` is
    a name, or no interface holds it (an IPv4 address is matched against each interface's
    primary address)."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 6:
        try:
            with open("/proc/net/if_inet6") as f:  # address in hex, index, prefix, scope, flags, name
                rows = [line.split() for line in f]
        except OSError:
            return None
        return next(
            (row[5] for row in rows if len(row) == 6 and row[0] == ip.exploded.replace(":", "")), None
        )
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # the interface has no IPv4 address
                continue
            if socket.inet_ntoa(answer[20:24]) == host:
                return name
    return None


def listen_unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def listen_tcp(host: str, port: int = 0) -> socket.socket:
    """A TCP socket listening on ``host`` (an IP address or a name; port 0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def of_listening_socket(sock: socket.socket) -> str:
    """The address peers reach ``sock`` at. A TCP socket bound to every interface is named by
    this machine's host name (its peers must be able to resolve it)."""
    if sock.family == socket.AF_UNIX:
        return str(UnixAddress(sock.getsockname()))
    host, port = sock.getsockname()[:2]
    if host in _WILDCARD_HOSTS:
        host = socket.gethostname()
    return str(TcpAddress(host, port))


def remove_socket_file(address: str) -> None:
    """Remove the file of a Unix socket address (nothing to do for TCP)."""
    parsed = parse(address)
    if isinstance(parsed, UnixAddress):
        try:
            os.unlink(parsed.path)
        except OSError:
            pass
