"""``slurm.job_from_json`` reads a job of ``squeue --json`` in the shape of SLURM 22.05 (what
the test cluster prints; tests/slurm/test_jobs.py reads it live) and in the shape newer
versions document.

The newer records follow the OpenAPI schemas that slurmrestd generates (``v0.0.41_job_info``
of Slurm 24.05.8, ``v0.0.43_job_info`` of 25.05.8, ``v0.0.44_job_info`` of 25.11.7), as
recorded in github.com/SlinkyProject/slurm-client, ``api/v0041/slurm-openapi.gen.json`` at
commit c54bafe002f5 and ``api/v0043/``, ``api/v0044/`` at cdcdeda907bd: ``job_state`` is an
array of state words, ``nodes`` a string, ``exit_code`` a ``process_exit_code_verbose``
object (``status`` words, ``return_code`` and ``signal.id`` as ``{set, infinite, number}``).
The 22.05 records are cut from the test cluster's own ``squeue --json`` (``openapi/v0.0.38``).
"""

from __future__ import annotations

from typing import Any

import pytest

from monarch._src.host import slurm


def _number(n: int | None) -> dict[str, Any]:
    return {"set": n is not None, "infinite": False, "number": n or 0}


def _verbose_exit(status: str, code: int | None, signal: int | None) -> dict[str, Any]:
    return {"status": [status], "return_code": _number(code), "signal": {"id": _number(signal), "name": ""}}


CASES = [
    # SLURM 22.05 (openapi/v0.0.38): a state string, the raw wait status
    (
        {"job_id": 1, "job_state": "RUNNING", "nodes": "n[1-2]", "exit_code": 0, "state_reason": "None"},
        ("1", "RUNNING", (), "n[1-2]", None, None),
    ),
    (
        {
            "job_id": 2,
            "job_state": "FAILED",
            "nodes": "n1",
            "exit_code": 768,
            "state_reason": "NonZeroExitCode",
        },
        ("2", "FAILED", (), "n1", 3, None),
    ),
    (
        {"job_id": 3, "job_state": "CANCELLED", "nodes": "n[1-2]", "exit_code": 15, "state_reason": "None"},
        ("3", "CANCELLED", (), "n[1-2]", 0, 15),
    ),
    (
        {"job_id": 4, "job_state": "PENDING", "nodes": "", "exit_code": 0, "state_reason": "Resources"},
        ("4", "PENDING", (), "", None, None),
    ),
    # Slurm 24.05 and later (data_parser v0.0.41+): state words, an exit code object
    (
        {
            "job_id": 5,
            "job_state": ["RUNNING", "CONFIGURING"],
            "nodes": "gpu[01-02]",
            "exit_code": _verbose_exit("PENDING", None, None),
            "state_reason": "None",
            "standard_output": "/scratch/slurm-5.out",
        },
        ("5", "RUNNING", ("CONFIGURING",), "gpu[01-02]", None, None),
    ),
    (
        {
            "job_id": 6,
            "job_state": ["FAILED"],
            "nodes": "gpu01",
            "exit_code": _verbose_exit("ERROR", 3, None),
            "state_reason": "NonZeroExitCode",
        },
        ("6", "FAILED", (), "gpu01", 3, None),
    ),
    (
        {
            "job_id": 7,
            "job_state": ["CANCELLED"],
            "nodes": "gpu[01-02]",
            "exit_code": _verbose_exit("SIGNALED", 0, 15),
            "state_reason": "None",
        },
        ("7", "CANCELLED", (), "gpu[01-02]", 0, 15),
    ),
    (
        {
            "job_id": 8,
            "job_state": ["PENDING"],
            "nodes": "",
            "exit_code": _verbose_exit("PENDING", None, None),
        },
        ("8", "PENDING", (), "", None, None),
    ),
]


@pytest.mark.parametrize(("record", "expected"), CASES, ids=[str(r["job_id"]) for r, _ in CASES])
def test_both_shapes_read_alike(record: dict[str, Any], expected: tuple[object, ...]) -> None:
    job = slurm.job_from_json(record)
    assert (job.job_id, job.state, job.flags, job.nodelist, job.exit_code, job.signal) == expected
    assert job.ended == (job.state in ("FAILED", "CANCELLED"))
    assert job.nodes == ()  # expanding the node list is `slurm.job`'s, with scontrol
