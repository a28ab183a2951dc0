"""Runtime settings read from the environment, overridable with ``monarch.config.configure``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


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
        )
    )
    #: Bytes of shared-memory files each process keeps for reuse by large messages it sends
    #: to processes on its host (0 turns the reuse off; every large buffer gets a fresh file).
    shm_pool_bytes: int = field(default_factory=lambda: _int_env("MONARCH_SHM_POOL_BYTES", 512 << 20))
    #: Seconds a pooled file may stay unused before it is removed (its memory freed).
    shm_pool_idle_s: float = field(default_factory=lambda: float(_int_env("MONARCH_SHM_POOL_IDLE_S", 30)))
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
    cleanup_timeout_s: float = field(default_factory=lambda: float(_int_env("MONARCH_CLEANUP_TIMEOUT_S", 3)))
    #: How long shutdown waits for a worker to exit by itself before killing it.
    stop_timeout_s: float = 5.0


CONFIG = RuntimeConfig()
