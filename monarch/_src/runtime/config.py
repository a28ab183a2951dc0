"""Runtime settings: one table, read from the environment, overridable with ``monarch.config``.

Each field of ``RuntimeConfig`` is a setting. Its value comes from, lowest first: the default,
its environment variable, and the overrides made with ``monarch.config.configure()`` (in this
process, or in an ancestor before it spawned this process: see ``OVERRIDES_ENV``).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import Field, dataclass, field, fields
from typing import Any


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


@dataclass
class RuntimeConfig:
    #: Largest frame accepted or sent, in bytes (Monarch's default is 10 GiB).
    max_frame_bytes: int = field(
        default_factory=lambda: _int_env(
            "MONARCH_MAX_FRAME_BYTES", _int_env("HYPERACTOR_CODEC_MAX_FRAME_LENGTH", 10 << 30)
        ),
        metadata={"monarch": "codec_max_frame_length"},
    )
    #: Bytes of shared-memory files each process keeps for reuse by large messages it sends
    #: to processes on its host (0 turns the reuse off; every large buffer gets a fresh file).
    shm_pool_bytes: int = field(default_factory=lambda: _int_env("MONARCH_SHM_POOL_BYTES", 512 << 20))
    #: Seconds a pooled file may stay unused before it is removed (its memory freed).
    shm_pool_idle_s: float = field(default_factory=lambda: float(_int_env("MONARCH_SHM_POOL_IDLE_S", 30)))
    #: Messages, and bytes, each connection keeps after writing them until its peer says it
    #: read them, so that those a dropped connection lost under a live peer are sent again
    #: (the oldest are forgotten beyond either bound: if lost, they are reported instead).
    resend_keep_messages: int = field(default_factory=lambda: _int_env("MONARCH_RESEND_KEEP_MESSAGES", 16384))
    resend_keep_bytes: int = field(default_factory=lambda: _int_env("MONARCH_RESEND_KEEP_BYTES", 32 << 20))
    #: Seconds a peer whose process is alive may stay unreachable (connections refused for
    #: lack of descriptors, a full listen backlog, no answer to the handshake) before it is
    #: declared dead; a peer whose process is gone is declared dead at once.
    peer_unreachable_s: float = field(
        default_factory=lambda: float(_int_env("MONARCH_PEER_UNREACHABLE_S", 120))
    )
    #: Seconds ``ActorMesh.stop()`` waits for each actor to finish the endpoint it is running
    #: (and the messages queued before the stop) and run ``__cleanup__``; past that the stop's
    #: Future fails with a ``SupervisionError`` naming the ranks that did not stop and what each
    #: is still running (they stop once it returns). Read in the process calling ``stop()``.
    actor_stop_timeout_s: float = field(
        default_factory=lambda: float(_int_env("MONARCH_ACTOR_STOP_TIMEOUT_S", 10))
    )
    #: Seconds a stopping process waits for the endpoint each actor is running to return, so that
    #: its ``__cleanup__`` can run, before it exits anyway (and says whose cleanup did not run).
    #: Monarch's ``cleanup_timeout`` (default 3 s). Read in each worker process.
    cleanup_timeout_s: float = field(
        default_factory=lambda: float(_int_env("MONARCH_CLEANUP_TIMEOUT_S", 3)),
        metadata={"monarch": "cleanup_timeout"},
    )
    #: Seconds attaching to a host agent may take (connect, authenticate, start the client's
    #: session there) before the host is reported unreachable: ``HostMesh.initialized`` and
    #: ``spawn_procs`` on it fail, naming its address. Monarch's ``mesh_attach_config_timeout``.
    host_attach_timeout_s: float = field(
        default_factory=lambda: float(_int_env("MONARCH_HOST_ATTACH_TIMEOUT_S", 10)),
        metadata={"monarch": "mesh_attach_config_timeout"},
    )
    #: Seconds a host reached through an agent may go without answering a heartbeat before it
    #: is declared lost (agent or session killed, network cut, machine frozen): every proc there
    #: fails at once, naming the host and this bound. Each process that attached to hosts or
    #: spawned procs on them pings each such host (not each proc) five times per bound; a host's
    #: session that hears nothing from the client for as long kills that client's procs there
    #: and exits. Read in the process that attaches or spawns; 0 turns heartbeats off.
    host_heartbeat_timeout_s: float = field(
        default_factory=lambda: float(_int_env("MONARCH_HOST_HEARTBEAT_TIMEOUT_S", 5))
    )
    #: Seconds the tensor ops issued after an endpoint call that was given a distributed tensor
    #: wait for that endpoint to end (they never run beside its use of the shard); past that
    #: they fail, naming the actor, and later ops run again. Read in each worker process.
    tensor_lend_timeout_s: float = field(
        default_factory=lambda: float(_int_env("MONARCH_TENSOR_LEND_TIMEOUT_S", 300))
    )
    #: How long shutdown waits for a worker to exit by itself before killing it.
    stop_timeout_s: float = 5.0
    #: What the listeners of this process's runtime and of the procs it spawns are: "unix"
    #: (Unix sockets, the default) or "tcp". Read when the runtime starts, so set it before:
    #: ``monarch.actor.enable_transport("tcp")`` does.
    transport: str = field(default_factory=lambda: os.environ.get("MONARCH_TRANSPORT", "unix"))
    #: The address TCP listeners bind to: loopback unless told otherwise. "0.0.0.0" or "::"
    #: listens on every interface (peers then reach it by this machine's host name); an
    #: interface's address listens there only. Anyone who can connect can try the handshake.
    tcp_bind_host: str = field(default_factory=lambda: os.environ.get("MONARCH_TCP_BIND_HOST", "127.0.0.1"))
    #: TLS for TCP connections: this process's certificate (PEM). TLS is on when the three
    #: tls_* files are set; each side must present a certificate signed by ``tls_ca``.
    tls_cert: str = field(default_factory=lambda: os.environ.get("MONARCH_TLS_CERT", ""))
    #: The private key of ``tls_cert`` (PEM).
    tls_key: str = field(default_factory=lambda: os.environ.get("MONARCH_TLS_KEY", ""))
    #: The CA certificates (PEM) that a peer's certificate must be signed by.
    tls_ca: str = field(default_factory=lambda: os.environ.get("MONARCH_TLS_CA", ""))
    #: How ``monarch.rdma`` moves bytes: "auto" (one-sided memory copies between processes of
    #: one host, chunks served by the owner's runtime between hosts), "tcp" (always the served
    #: chunks, also on one host) or "none" (``RDMABuffer`` refuses to be made). Read in each
    #: process that makes a buffer or transfers.
    rdma_backend: str = field(default_factory=lambda: os.environ.get("MONARCH_RDMA_BACKEND", "auto"))
    #: Monarch's switch for the software path: False makes "auto" mean "none" where no ibverbs
    #: device is used, so that ``RDMABuffer`` fails instead of falling back.
    rdma_allow_tcp_fallback: bool = field(
        default_factory=lambda: (
            os.environ.get("MONARCH_RDMA_ALLOW_TCP_FALLBACK", "1") not in ("0", "false", "False")
        )
    )
    #: Whether a runtime raises its process's soft descriptor limit to the hard one (at most
    #: 65,536) as it starts; see ``fd_limit``.
    raise_fd_limit: bool = field(
        default_factory=lambda: os.environ.get("MONARCH_RAISE_FD_LIMIT", "1") not in ("0", "false", "False")
    )
    #: Bytes per request when the owner's runtime serves a buffer in chunks (four are in
    #: flight per transfer), and per system call of a one-sided copy.
    rdma_chunk_bytes: int = field(default_factory=lambda: _int_env("MONARCH_RDMA_CHUNK_BYTES", 8 << 20))


#: The values of the ``transport`` setting.
TRANSPORTS = ("unix", "tcp")


CONFIG = RuntimeConfig()


def transport_of_config() -> str:
    """The ``transport`` setting, checked."""
    if CONFIG.transport not in TRANSPORTS:
        raise ValueError(
            f"unknown monarch transport {CONFIG.transport!r} (setting transport, MONARCH_TRANSPORT)\n"
            f"HINT: the transports are: {', '.join(TRANSPORTS)}"
        )
    return CONFIG.transport


# -- monarch.config: configure() and friends -----------------------------------------------------
#
# Every field of RuntimeConfig is a setting, under its own name and, where Monarch has one
# for the same thing, under Monarch's name too (``metadata={"monarch": ...}``): a field added
# above is configurable with nothing else to change.

#: What ``configure`` set, in JSON, for processes spawned afterwards: they inherit the
#: environment and apply it on start, so overrides follow the whole tree of processes.
OVERRIDES_ENV = "MONARCH_CONFIG_OVERRIDES"

_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

_lock = threading.RLock()
#: The runtime layer: settings made with configure() here or inherited from the parent process.
_overrides: dict[str, Any] = {}


def _fields() -> dict[str, Field[Any]]:
    return {f.name: f for f in fields(RuntimeConfig)}


def _monarch_names() -> dict[str, str]:
    return {f.metadata["monarch"]: f.name for f in fields(RuntimeConfig) if "monarch" in f.metadata}


def _setting_name(key: str) -> str:
    if key in _fields():
        return key
    name = _monarch_names().get(key)
    if name is None:
        known = ", ".join(sorted([*_fields(), *_monarch_names()]))
        raise ValueError(f"unknown monarch config key {key!r}\nHINT: the settings are: {known}")
    return name


def _seconds(key: str, text: str) -> float:
    """Parse a humantime duration, Monarch's format for timeouts: ``"30s"``, ``"1h 30m"``, ``"250ms"``."""
    total, pos = 0.0, 0
    while pos < len(text.rstrip()):
        m = _DURATION.match(text, pos)
        if m is None:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos == 0 or text[pos:].strip():
        raise TypeError(
            f"Invalid duration format for {key}: {text!r}\n"
            "HINT: give seconds as a number, or a duration such as '30s', '5m', '1h 30m', '250ms'"
        )
    return total


def _checked(key: str, f: Field[Any], value: Any) -> Any:
    """``value`` as the type of setting ``f``, or a TypeError/ValueError saying what is accepted."""
    expected = _TYPES.get(f.type) if isinstance(f.type, str) else f.type
    if not isinstance(expected, type):
        expected = type(getattr(CONFIG, f.name))
    if expected is float and isinstance(value, str) and f.name.endswith("_s"):
        value = _seconds(key, value)
    numeric = expected in (int, float)
    if isinstance(value, bool) and expected is not bool:
        ok = False
    elif expected is float:
        ok = isinstance(value, (int, float))
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise TypeError(
            f"monarch config {key} takes {expected.__name__}, got {type(value).__name__} {value!r}"
        )
    if numeric and value < 0:
        raise ValueError(f"monarch config {key} must be >= 0, got {value!r}")
    return expected(value)


def _apply(settings: dict[str, Any]) -> None:
    """Check every setting first, then apply them all: a bad one changes nothing."""
    known = _fields()
    checked = {}
    for key, value in settings.items():
        name = _setting_name(key)
        checked[name] = _checked(key, known[name], value)
    with _lock:
        for name, value in checked.items():
            setattr(CONFIG, name, value)
        _overrides.update(checked)
        _publish()


def _publish() -> None:
    if _overrides:
        import json

        os.environ[OVERRIDES_ENV] = json.dumps(_overrides, sort_keys=True)
    else:
        os.environ.pop(OVERRIDES_ENV, None)


def configure(**settings: Any) -> None:
    """Set monarch settings for this process and every process it spawns afterwards.

    Keys are the names ``get_global_config()`` lists (Monarch's names where monarch-aio has
    the same setting, e.g. ``codec_max_frame_length``). Timeouts (settings ending in ``_s``)
    take seconds or a duration string (``"30s"``, ``"1h 30m"``). A setting takes effect where it
    is next read: the process's runtime reads its own when it starts (first spawn or call),
    worker processes when they start. An unknown key raises ``ValueError``, a value of the
    wrong type ``TypeError``; either way nothing is changed.
    """
    _apply(settings)


def get_global_config() -> dict[str, Any]:
    """Every setting with its value in effect: defaults, environment, then ``configure``.

    Changing the returned dict changes nothing; use :func:`configure`.
    """
    with _lock:
        values = {f.name: getattr(CONFIG, f.name) for f in fields(RuntimeConfig)}
        values.update({alias: values[name] for alias, name in _monarch_names().items()})
    return values


def get_runtime_config() -> dict[str, Any]:
    """Only what ``configure`` set (in this process, or inherited from the one that spawned it)."""
    with _lock:
        return dict(_overrides)


def clear_runtime_config() -> None:
    """Undo every ``configure``: settings return to their environment or default values."""
    base = RuntimeConfig()
    with _lock:
        for name in _overrides:
            setattr(CONFIG, name, getattr(base, name))
        _overrides.clear()
        _publish()


@contextlib.contextmanager
def configured(**overrides: Any) -> Iterator[dict[str, Any]]:
    """Apply ``overrides`` for the duration of a ``with`` block; yield ``get_global_config()``.

    On exit the settings made with ``configure`` before the block are restored, even if the
    block (or a bad override) raised. The change is process-wide: other threads see it too,
    as do processes spawned inside the block.
    """
    previous = get_runtime_config()
    try:
        configure(**overrides)
        yield get_global_config()
    finally:
        with _lock:
            clear_runtime_config()
            _apply(previous)


#: Settings that describe one machine: how its processes listen (an interface of that machine),
#: and its TLS files (paths on that machine). Procs a client spawns on another host keep that
#: host's own, whatever the client configured; its other overrides reach them.
PER_MACHINE = ("transport", "tcp_bind_host", "tls_cert", "tls_key", "tls_ca")


def overrides_for_another_host() -> str | None:
    """What ``configure`` set in this process, less ``PER_MACHINE``, as ``OVERRIDES_ENV`` holds
    it: for procs spawned on another host (None: nothing to pass)."""
    import json

    with _lock:
        portable = {k: v for k, v in _overrides.items() if k not in PER_MACHINE}
    return json.dumps(portable, sort_keys=True) if portable else None


def with_this_machine(overrides: str) -> str:
    """A client's ``overrides_for_another_host``, plus this process's own ``PER_MACHINE``
    overrides (a TLS agent's certificate files): what procs spawned here for it get."""
    import json

    with _lock:
        local = {k: v for k, v in _overrides.items() if k in PER_MACHINE}
    if not local:
        return overrides
    return json.dumps({**json.loads(overrides), **local}, sort_keys=True)


def _inherit_overrides() -> None:
    raw = os.environ.get(OVERRIDES_ENV)
    if not raw:
        return
    import json

    try:
        settings = json.loads(raw)
        if not isinstance(settings, dict):
            raise ValueError("not a JSON object")
        _apply(settings)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"{OVERRIDES_ENV}={raw!r} is not valid: {e}\n"
            "HINT: it is written by monarch.config.configure(); unset it"
        ) from None


_inherit_overrides()
