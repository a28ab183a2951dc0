"""The tensor engine costs nothing until used: ``import monarch`` and ``import monarch.actor``
import no torch; the first tensor name asked of ``monarch`` does."""

from __future__ import annotations

from helpers import run_python


def test_torch_comes_only_with_the_tensor_engine() -> None:
    code = (
        "import sys, monarch, monarch.actor\n"
        "print('torch' in sys.modules)\n"
        "monarch.fetch_shard\n"
        "print('torch' in sys.modules, sorted(n for n in monarch.__all__ if not hasattr(monarch, n)))\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["False", "True []"]


def test_activate_without_the_tensor_layer_says_what_to_do() -> None:
    code = (
        "from monarch._src.actor import proc_mesh\n"
        "try:\n"
        "    proc_mesh.proc_mesh_reference(('unix:/nowhere',), proc_mesh.Extent(['gpus'], [1])).activate()\n"
        "except RuntimeError as e:\n"
        "    print(e)\n"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert "the tensor engine is not loaded" in out.stdout and "HINT: import monarch.actor" in out.stdout
