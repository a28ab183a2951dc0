"""Tracebacks of actors defined in a script's ``__main__`` or a notebook cell name the real file
(or cell) and show the source line, in whichever process the actor raised.

Such classes travel by value; cloudpickle alone renames their code ``<dynamic-code>``, which
leaves a traceback with no file and no source.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ACTOR = """from monarch.actor import Actor, endpoint, this_host

class Boom(Actor):
    @endpoint
    def go(self):
        detail = "a line worth seeing"
        raise ValueError("kaboom: " + detail)
"""

CALL = """
pm = this_host().spawn_procs(per_host={"gpus": 1})
try:
    pm.spawn("boom", Boom).go.call_one().get(timeout=30)
except Exception as e:
    print("ERROR", e, flush=True)
finally:
    pm.stop().get(timeout=10)
"""


def run(argv: list[str], cwd: Path) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=45, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ERROR" in proc.stdout, proc.stdout + proc.stderr
    return proc.stdout


def test_actor_of_a_script_names_the_file_and_shows_the_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(ACTOR + CALL)
    out = run([sys.executable, "train.py"], cwd=tmp_path)
    assert f'File "{script}", line 7, in go' in out, out
    assert 'raise ValueError("kaboom: " + detail)' in out
    assert "<dynamic-code>" not in out


def test_actor_of_a_notebook_cell_names_the_cell_and_shows_the_line(tmp_path: Path) -> None:
    driver = textwrap.dedent(
        f"""
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        shell.run_cell({ACTOR!r})
        shell.run_cell({CALL!r})
        """
    )
    out = run([sys.executable, "-c", driver], cwd=tmp_path)
    assert 'File "<ipython-input-1-' in out and '>", line 7, in go' in out, out
    assert 'raise ValueError("kaboom: " + detail)' in out
    assert "<dynamic-code>" not in out
