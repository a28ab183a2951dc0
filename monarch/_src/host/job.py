"""Jobs (``monarch.job``): named host meshes obtained in one call, as Monarch's ``JobTrait``.

``job.state()`` returns a ``JobState`` whose attributes are ``HostMesh`` es, one per name the
job was given. ``LocalJob`` names this machine; ``ProcessJob`` starts local host agents (a
``{"hosts": N}`` mesh per name, the processes of ``hosts_from_config("local:N")``), torn down
by ``kill()`` or when the client exits. ``SlurmJob`` (``slurm_job.py``) asks SLURM for nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from monarch._src.host.host_mesh import HostMesh, this_host

#: Where ``state()`` keeps what a later program needs to re-attach to a scheduler's job
#: (Monarch's default path; local jobs write nothing).
DEFAULT_CACHED_PATH = ".monarch/job_state.pkl"


class JobState:
    """The host meshes of a job, as attributes (``state.hosts``, ``state.trainers``)."""

    def __init__(self, hosts: Mapping[str, HostMesh]) -> None:
        self._hosts = dict(hosts)

    def __getattr__(self, name: str) -> HostMesh:
        try:
            return self.__dict__["_hosts"][name]
        except KeyError:
            known = ", ".join(self.__dict__.get("_hosts", {})) or "none"
            raise AttributeError(f"this job has no host mesh named {name!r} (it has: {known})") from None

    def __repr__(self) -> str:
        return f"JobState({self._hosts})"


class JobTrait:
    """A set of named host meshes: ``state()`` gets them (once), ``kill()`` ends them."""

    def __init__(self) -> None:
        self._state: JobState | None = None
        self._killed = False

    def state(self, cached_path: str | None = DEFAULT_CACHED_PATH) -> JobState:
        """The job's host meshes, made on the first call and the same afterwards.

        ``cached_path``: where a job whose machines outlive this program (``SlurmJob``)
        records how to re-attach to them, so that a later program with the same job spec
        attaches instead of asking for new machines; None: no file. Local jobs keep their
        state in this client (their agents do not outlive it) and write no file."""
        if self._killed:
            raise RuntimeError("this job was killed; create a new one")
        if self._state is None:
            self._state = JobState(self._create(cached_path))
        return self._state

    def kill(self) -> None:
        """End the job: shut down every host mesh it made (waits for them)."""
        self._killed = True
        state, self._state = self._state, None
        if state is not None:
            self._release(state)

    def _create(self, cached_path: str | None) -> dict[str, HostMesh]:
        raise NotImplementedError

    def _release(self, state: JobState) -> None:
        pass


class LocalJob(JobTrait):
    """Every name is this machine (``this_host()``): a job for development on one host."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self._names = list(hosts)

    def _create(self, cached_path: str | None) -> dict[str, HostMesh]:
        return {name: this_host() for name in self._names}


class ProcessJob(JobTrait):
    """``meshes={"hosts": N, ...}``: N local host agents per name, each name a ``{"hosts": N}``
    HostMesh; ``env`` is added to the environment of the agents and of the procs they spawn."""

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        for name, count in meshes.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(
                    f"ProcessJob: meshes[{name!r}] must be a positive number of hosts, got {count!r}"
                )
        self._meshes = dict(meshes)
        self._env = dict(env or {})

    def _create(self, cached_path: str | None) -> dict[str, HostMesh]:
        from monarch._src.host.hosts_config import local_hosts

        return {name: local_hosts(count, self._env) for name, count in self._meshes.items()}

    def _release(self, state: JobState) -> None:
        shut_down(state)


def shut_down(state: JobState, timeout: float = 30.0) -> None:
    """Shut down every host mesh of ``state`` (their procs stop, this client's sessions end)."""
    futures: list[Any] = [mesh.shutdown() for mesh in state._hosts.values()]
    for f in futures:
        f.get(timeout=timeout)
