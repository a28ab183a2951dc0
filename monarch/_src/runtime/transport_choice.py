"""``enable_transport``: Monarch's way to choose what every process of a job listens on.

It must come before the first use of the API: this process's runtime reads the choice when it
starts (first spawn or call), and the procs it spawns get listening sockets of the same kind.
With "tcp" every listener is a TCP socket on ``CONFIG.tcp_bind_host`` (loopback unless told
otherwise), so mesh references carry ``tcp:`` addresses, and large buffers travel inline
(shared memory is only for peers reached by Unix sockets; see ``transport.address``).
"""

from __future__ import annotations

from monarch._src.runtime.config import CONFIG, configure

#: Monarch's names accepted by ``enable_transport`` and the transport each selects. "tls" is
#: TCP that insists on the TLS settings being there.
ACCEPTED = {"ipc": "unix", "unix": "unix", "tcp": "tcp", "tls": "tcp"}


def enable_transport(transport: str) -> None:
    """Listen on ``transport`` ("tcp", "tls", or "ipc", the default Unix sockets) in this
    process and every proc it spawns. Call it before anything else of the monarch API."""
    if not isinstance(transport, str):
        raise TypeError(f"enable_transport() takes a transport name, got {type(transport).__name__}")
    name = transport.lower()
    kind = ACCEPTED.get(name)
    if kind is None:
        raise ValueError(
            f"unknown transport {transport!r}\nHINT: the transports are: {', '.join(ACCEPTED)} "
            "(Monarch's metatls transports and explicit channel addresses are not supported)"
        )
    if name == "tls" and not (CONFIG.tls_cert and CONFIG.tls_key and CONFIG.tls_ca):
        raise ValueError(
            "enable_transport('tls') needs a certificate, its key and a CA file\n"
            "HINT: set tls_cert, tls_key and tls_ca with monarch.configure(), or "
            "MONARCH_TLS_CERT, MONARCH_TLS_KEY and MONARCH_TLS_CA, before enable_transport."
        )
    from monarch._src.runtime.runtime import Runtime  # asyncio and uvloop: not on `import monarch.actor`

    rt = Runtime.current()
    if rt is not None and rt.transport == kind:
        return  # started on it already
    if rt is not None:
        raise RuntimeError(
            "`enable_transport()` must be called before any other calls in the monarch API. "
            f"This process's runtime already started on {rt.transport!r} transport "
            f"(it listens at {rt.address}).\n"
            f"HINT: call monarch.actor.enable_transport({transport!r}) at the start of the "
            "program, before spawning procs or actors or calling endpoints."
        )
    configure(transport=kind)
