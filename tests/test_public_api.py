"""The public face is exact: what ``__all__`` promises exists, pickles by reference and is documented.

Public modules are found by walking the package (every module path without an underscore
component), so a new facade is checked the day it lands.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import re
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import monarch

REPO = Path(__file__).resolve().parent.parent


def _public_modules() -> list[str]:
    names = ["monarch"]
    for info in pkgutil.walk_packages(monarch.__path__, "monarch."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


PUBLIC_MODULES = _public_modules()


def _exports() -> list[tuple[str, str]]:
    return [(m, n) for m in PUBLIC_MODULES for n in getattr(importlib.import_module(m), "__all__", ())]


def test_the_known_facades_are_walked() -> None:
    assert {"monarch", "monarch.actor", "monarch.launch"} <= set(PUBLIC_MODULES)


@pytest.mark.parametrize("modname", PUBLIC_MODULES)
def test_all_is_exactly_the_public_set(modname: str) -> None:
    mod = importlib.import_module(modname)
    assert hasattr(mod, "__all__"), f"{modname} has no __all__: say what it exports, even if nothing"
    declared = mod.__all__
    assert len(declared) == len(set(declared)), f"{modname}.__all__ repeats a name"
    missing = [n for n in declared if not hasattr(mod, n)]
    assert not missing, f"{modname}.__all__ names what the module lacks: {missing}"
    # A module is public only when __all__ re-exports it (monarch.actor.config): subpackages
    # appear as attributes once imported, and `import os` or `from __future__ import
    # annotations` in a module that implements its API are not part of that API.
    public = {
        n
        for n, v in vars(mod).items()
        if not n.startswith("_")
        and not (isinstance(v, ModuleType) and n not in declared)
        and type(v).__module__ != "__future__"
    }
    assert public == set(declared), (
        f"{modname}: public names not in __all__: {sorted(public - set(declared))}; "
        f"in __all__ but not public: {sorted(set(declared) - public)}"
    )


@pytest.mark.parametrize(("modname", "name"), _exports())
def test_every_export_pickles_by_reference(modname: str, name: str) -> None:
    obj = getattr(importlib.import_module(modname), name)
    if isinstance(obj, ModuleType):
        assert importlib.import_module(obj.__name__) is obj
        return
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return
    # pickle (and cloudpickle, which otherwise ships the whole class by value) finds a class
    # or function again by __module__ plus __qualname__.
    home = importlib.import_module(obj.__module__)
    found: Any = home
    for part in obj.__qualname__.split("."):
        found = getattr(found, part, None)
    assert found is obj, f"{modname}.{name}: {obj.__module__}.{obj.__qualname__} does not lead back to it"
    assert pickle.loads(pickle.dumps(obj)) is obj


def _member_function(raw: Any) -> Any:
    """The function whose docstring documents a class attribute, or None if it is not callable."""
    if isinstance(raw, (staticmethod, classmethod)):
        return raw.__func__
    if isinstance(raw, property):
        return raw.fget
    if inspect.isfunction(raw):
        return raw
    return None


def _public_callables() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for modname, name in _exports():
        obj = getattr(importlib.import_module(modname), name)
        if isinstance(obj, ModuleType) or not callable(obj):
            continue
        found[f"{modname}.{name}"] = obj
        if not inspect.isclass(obj):
            continue
        for attr in dir(obj):
            if attr.startswith("_"):
                continue
            owner = next(k for k in obj.__mro__ if attr in vars(k))
            if not owner.__module__.startswith("monarch"):
                continue  # inherited from the standard library (Exception.add_note, ...)
            fn = _member_function(vars(owner)[attr])
            if fn is not None:
                found[f"{modname}.{name}.{attr}"] = fn
    return found


def test_every_public_callable_has_a_docstring() -> None:
    callables = _public_callables()
    assert len(callables) > 100, "the walk found too few callables; is it still looking?"
    bare = [qual for qual, fn in callables.items() if len((fn.__doc__ or "").split()) < 3]
    assert not bare, "public callables without a docstring (say what it is for):\n" + "\n".join(bare)


def _tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout, so the tracked files are unknown: {e}")
    files = []
    for rel in out.decode().split("\0"):
        path = REPO / rel
        if rel and path.is_file() and path.suffix in {".py", ".md", ".sh", ".toml", ".txt", ""}:
            files.append(path)
    return files


# A path of one machine (its checkout, its user's home) or a file beside the repo, not in it.
_FOREIGN_PATH = re.compile(
    r"(?:/work|/home|/Users)/[\w.-]+(?:/[\w.-]+)*|(?<![\w/.])shared/(?:spec|DESIGN)\S*"
)
_MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_no_file_cites_a_path_outside_the_repo() -> None:
    me = Path(__file__).resolve()
    found = []
    for path in _tracked_text_files():
        if path == me:
            continue
        text = path.read_text(errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            rel = path.relative_to(REPO)
            for m in _FOREIGN_PATH.finditer(line):
                found.append(f"{rel}:{lineno}: {m.group(0)!r} in {line.strip()!r}")
            if path.suffix == ".md":
                for m in _MD_LINK.finditer(line):
                    target = m.group(1)
                    if "://" in target or target.startswith("mailto:"):
                        continue
                    if (
                        not (path.parent / target).resolve().is_relative_to(REPO)
                        or not (path.parent / target).exists()
                    ):
                        found.append(f"{rel}:{lineno}: link to {target!r} outside the repo or missing")
    assert not found, "files cite what a reader of the repo cannot open:\n" + "\n".join(found)
