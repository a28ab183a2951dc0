"""The fast default: the launcher forks the ranks from a template that imported torch once, only
when the script cannot tell (it imports torch before doing anything, and the variables torch
reads at import are the same in every rank); ``--preload none`` and ``--preload torch`` decide."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_helpers import Scripts, clean_env, monarch_launch

from monarch._src.launch.command import EntryKind, WorkerCommand
from monarch._src.launch.preload import auto_preload, read_at_torch_import, script_problem

#: Imported before torch by the scripts below: records whether torch was already there.
PROBE = """
import sys
PRELOADED = "torch" in sys.modules
"""

#: Safe: only a docstring, __future__ and imports before `import torch`.
SAFE = '''
"""Dumps what the rank sees."""
from __future__ import annotations
import probe
import torch
import json, os, sys
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as fp:
    json.dump({"env": dict(os.environ), "threads": torch.get_num_threads(), "preloaded": probe.PRELOADED}, fp)
'''

#: Unsafe: sets a variable torch reads at import before importing it.
UNSAFE = """
import os
os.environ["OMP_NUM_THREADS"] = "1"
import probe
import torch
import json, sys
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as fp:
    json.dump({"threads": torch.get_num_threads(), "preloaded": probe.PRELOADED}, fp)
"""

#: Per run: the launcher's store port, run id (a fresh UUID) and temporary log directory.
RANDOM = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}


def ranks_of(scripts: Scripts, tmp_path: Path, name: str, body: str, *flags: str, **env: str) -> list[dict]:
    scripts.write("probe.py", PROBE)
    script = scripts.write(name, body)
    out = tmp_path / f"{name}{'_'.join(flags)}"
    out.mkdir()
    run = monarch_launch(*flags, "--nproc-per-node", "2", script, str(out), env=clean_env(**env), timeout=90)
    assert run.rc == 0, run
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("omp", [None, "2"])
def test_preloaded_ranks_see_what_ranks_that_import_torch_themselves_see(
    scripts: Scripts, tmp_path: Path, omp: str | None
) -> None:
    pytest.importorskip("torch")
    env = {"OMP_NUM_THREADS": omp} if omp else {}
    fast = ranks_of(scripts, tmp_path, "safe.py", SAFE, **env)
    slow = ranks_of(scripts, tmp_path, "safe.py", SAFE, "--preload", "none", **env)
    assert [r["preloaded"] for r in fast] == [True, True]
    assert [r["preloaded"] for r in slow] == [False, False]
    for mine, ref in zip(fast, slow, strict=True):
        assert mine["threads"] == ref["threads"] == int(omp or 1)
        differing = {k for k in set(mine["env"]) | set(ref["env"]) if mine["env"].get(k) != ref["env"].get(k)}
        assert differing <= RANDOM, differing


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_script_that_sets_the_environment_first_is_not_preloaded_unless_forced(
    scripts: Scripts, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    # (torch uses at most as many threads as there are cores: 2 on the smallest machines.)
    default = ranks_of(scripts, tmp_path, "unsafe.py", UNSAFE, OMP_NUM_THREADS="2")
    assert default == [{"threads": 1, "preloaded": False}] * 2  # the script's own setting took effect
    forced = ranks_of(scripts, tmp_path, "unsafe.py", UNSAFE, "--preload", "torch", OMP_NUM_THREADS="2")
    assert forced == [{"threads": 2, "preloaded": True}] * 2  # what the default protects it from


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ('"""doc"""\nfrom __future__ import annotations\nimport os, sys\nimport torch\nx = 1\n', None),
        ("import numpy as np\nfrom torch import nn\n", None),
        ("import torch.distributed as dist\n", None),
        ("import os\nos.environ['OMP_NUM_THREADS'] = '4'\nimport torch\n", "line 2 runs before"),
        ("try:\n    import torch\nexcept ImportError:\n    pass\n", "line 1 runs before"),
        ("def main():\n    import torch\n", "line 1 runs before"),
        ("import os\n", "no top-level `import torch`"),
        ("from .torch import x\nx = 1\nimport torch\n", "line 2 runs before"),  # not torch
        ("import torch(\n", "does not parse"),
    ],
)
def test_only_imports_and_docstrings_may_come_before_import_torch(source: str, problem: str | None) -> None:
    found = script_problem(source, "s.py")
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def test_ranks_that_differ_in_a_variable_torch_reads_at_import_are_not_preloaded(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import torch\n")
    command = WorkerCommand(EntryKind.SCRIPT, str(script), (), "python")
    same = [{"OMP_NUM_THREADS": "1", "RANK": str(r)} for r in range(2)]  # RANK is not read at import
    assert auto_preload(command, same)[0] == ("torch",)
    devices = [{"CUDA_VISIBLE_DEVICES": str(r)} for r in range(2)]  # --virtual-local-rank
    modules, why = auto_preload(command, devices)
    assert modules == () and "CUDA_VISIBLE_DEVICES differs between ranks" in why
    assert auto_preload(WorkerCommand(EntryKind.MODULE, "pkg.train", (), "python"), same)[0] == ()
    assert read_at_torch_import("OMP_NUM_THREADS") and read_at_torch_import("TORCH_LOGS")
    assert not read_at_torch_import("TORCHELASTIC_ERROR_FILE") and not read_at_torch_import("RANK")
