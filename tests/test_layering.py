"""The layering rule of docs/design.md: each layer imports only from the layers below it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "monarch" / "_src"
LAYERS = ["wire", "transport", "runtime", "mesh", "actor", "host", "launch"]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_no_upward_imports() -> None:
    violations = []
    for i, layer in enumerate(LAYERS):
        above = LAYERS[i + 1 :]
        for path in (SRC / layer).rglob("*.py"):
            for mod in _imports(path):
                for up in above:
                    if mod == f"monarch._src.{up}" or mod.startswith(f"monarch._src.{up}."):
                        violations.append(f"{path.relative_to(SRC)} imports {mod}")
    assert not violations, "\n".join(violations)


def test_public_names_import() -> None:
    actor = importlib.import_module("monarch.actor")
    for name in actor.__all__:
        assert getattr(actor, name) is not None, name


def test_import_monarch_actor_does_not_import_torch() -> None:
    code = "import sys, monarch.actor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
