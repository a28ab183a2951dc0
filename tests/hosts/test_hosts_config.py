"""``hosts_from_config(name)`` and ``monarch.job``: the accepted forms, clear errors for the
others, and jobs whose state's attributes are host meshes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest
from actors import Pid
from helpers import wait_gone

from monarch.actor import hosts_from_config
from monarch.job import LocalJob, ProcessJob

pytestmark = pytest.mark.timeout(60)

FORMS = ("local:N", "ADDRESS[,ADDRESS...]", "/path/to/file", "slurm")


@pytest.mark.parametrize(
    "value, says",
    [
        (None, "the environment variable MONARCH_TEST_HOSTS is not set"),
        ("", "the environment variable MONARCH_TEST_HOSTS is not set"),
        ("local:0", "local:N takes a positive number of hosts"),
        ("local:two", "local:N takes a positive number of hosts"),
        ("somehost:1234", "'somehost:1234' is not a host agent address, nor a file"),
        ("unix:/a.sock,elsewhere", "'elsewhere' is not a host agent address"),
        ("slurm:nodes=3", "slurm takes no options"),
        ("slurm", "not inside a SLURM allocation: SLURM_JOB_ID and SLURM_JOB_NODELIST are not set"),
    ],
)
def test_unset_or_malformed_shows_the_accepted_forms(
    monkeypatch: pytest.MonkeyPatch, value: Any, says: str
) -> None:
    if value is None:
        monkeypatch.delenv("MONARCH_TEST_HOSTS", raising=False)
    else:
        monkeypatch.setenv("MONARCH_TEST_HOSTS", value)
    with pytest.raises(ValueError) as info:
        hosts_from_config("MONARCH_TEST_HOSTS")
    message = str(info.value)
    assert says in message and all(form in message for form in FORMS), message


def test_addresses_need_the_agents_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_TEST_HOSTS", "unix:/nonexistent/agent.sock")
    monkeypatch.delenv("MONARCH_HOST_SECRET", raising=False)
    monkeypatch.delenv("MONARCH_HOST_SECRET_FILE", raising=False)
    with pytest.raises(ValueError, match="HINT: set MONARCH_HOST_SECRET or MONARCH_HOST_SECRET_FILE"):
        hosts_from_config("MONARCH_TEST_HOSTS")


def test_a_file_of_addresses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agent: Any) -> None:
    config = tmp_path / "hosts.txt"
    config.write_text(f"# two hosts, one agent\n{agent.address}\n{agent.address}  # again\n")
    monkeypatch.setenv("MONARCH_TEST_HOSTS", str(config))
    monkeypatch.setenv("MONARCH_HOST_SECRET_FILE", agent.secret_file)
    hosts = hosts_from_config("MONARCH_TEST_HOSTS")
    assert dict(hosts.extent) == {"hosts": 2}
    procs = hosts.spawn_procs()
    assert len(procs.spawn("pid", Pid).pid.call().get(timeout=20)) == 2
    hosts.shutdown().get(timeout=30)


def test_a_file_with_local_n(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "hosts.txt"
    config.write_text("local:1\n")
    monkeypatch.setenv("MONARCH_TEST_HOSTS", str(config))
    hosts = hosts_from_config("MONARCH_TEST_HOSTS")
    assert dict(hosts.extent) == {"hosts": 1} and hosts.initialized.get(timeout=20)
    hosts.shutdown().get(timeout=30)


def test_process_job_state_attributes_are_host_meshes() -> None:
    job = ProcessJob({"hosts": 2, "trainers": 1})
    state = job.state()
    assert dict(state.hosts.extent) == {"hosts": 2} and dict(state.trainers.extent) == {"hosts": 1}
    assert job.state() is state
    with pytest.raises(AttributeError, match="no host mesh named 'workers'"):
        state.workers  # noqa: B018
    pid = state.trainers.spawn_procs().spawn("pid", Pid).pid.call_one().get(timeout=20)
    session = psutil.Process(pid).ppid()
    agent = psutil.Process(session).ppid()
    job.kill()
    assert wait_gone([pid, session, agent]) == []
    with pytest.raises(RuntimeError, match="this job was killed"):
        job.state()


def test_local_job_is_this_host() -> None:
    state = LocalJob(hosts=("hosts", "data")).state()
    assert dict(state.hosts.extent) == {} and dict(state.data.extent) == {}
