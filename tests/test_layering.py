"""The layering rules of docs/design.md, checked on the source (an AST scan, no imports).

1. Layers form a dependency graph (``DEPENDS_ON``): a module of layer L imports (absolutely,
   relatively, at the top or inside a function) only from L itself and the layers L depends
   on, directly or not. ``wire`` and ``mesh`` depend on nothing of ours.

2. Layers talk through interfaces, not private attributes. Within the package (tests may use
   internals), a module M must not

   - import a single-underscore name from a module of ours (``from monarch._src.x import _y``,
     or ``from .x import _y``); or
   - read or write ``obj._attr`` where ``_attr`` is an attribute name of ours (a method, a
     class-body name, a ``__slots__`` entry or an ``x._attr = ...`` target somewhere in the
     package) that M itself does not define that way. A module's global variables do not
     count as attributes, so ``mesh._owner`` in a module with a global ``_owner`` is caught.

   Dunder names are fine; so are private names of other libraries (``os._exit``), which no
   module of ours defines. The rule is by name, so a class's private attribute used by a
   helper function of the same module is fine, and one module's ``_x`` is not confused with
   another's only when neither touches the other's.

   ``ALLOWED`` lists what still crosses a module boundary, each with the reason; an entry
   that no longer matches anything fails the test, so the list can only shrink.

3. The modules of the actor package have an order (``ACTOR_ORDER``): data types and errors,
   then futures and ports, then endpoints and meshes, then the instance and its dispatch. At
   module level a module imports only modules earlier in the list; a function-local import of
   a later one says why on its line (a comment). No module of ours is part of an import cycle
   at module level (imports under ``if TYPE_CHECKING:`` do not count).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "monarch"
SRC = PACKAGE / "_src"

DEPENDS_ON: dict[str, set[str]] = {
    "wire": set(),
    "mesh": set(),
    "transport": {"wire"},
    "runtime": {"transport"},
    "actor": {"runtime", "mesh"},
    "host": {"actor"},
    "launch": {"host"},
    "spmd": {"host"},
    "rdma": {"actor"},
    "tensor": {"host"},
}

#: The modules of ``_src/actor/``, lowest first (see rule 3).
ACTOR_ORDER = [
    # data types and errors, and this process's state
    "coroutines",
    "config",
    "errors",
    "context",
    "log_prefix",
    "log_aggregator",
    "process_state",
    # futures and ports (and the supervision that fails the ports of a dead process, and the
    # unpickling off the loop of what may wait for work of this process)
    "future",
    "supervision",
    "unpickle_off_loop",
    "port",
    "collectors",
    "undelivered",
    "log_forwarding",
    "multicast",
    # endpoints and meshes
    "endpoint",
    "actor",
    "actor_mesh",
    "messaging",
    "proc_mesh",
    # the instance and its dispatch
    "instance",
    "dispatch",
]

#: (module relative to monarch/, name) -> why the crossing stays for now.
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> Iterator[tuple[Path, str]]:
    """Each source file of the package and its dotted package (for relative imports)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        package = parts if path.name == "__init__.py" else parts[:-1]
        yield path, ".".join(p for p in package if p != "__init__")


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path, package: str) -> Iterator[tuple[str, list[str]]]:
    """(module, imported names) for every import in ``path``, relative ones resolved."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield _absolute(node, package), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["monarch", "_src"] else None


def _reachable(layer: str) -> set[str]:
    seen = {layer}
    todo = [layer]
    while todo:
        for dep in DEPENDS_ON[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _attribute_names(tree: ast.AST) -> set[str]:
    """Attribute names a module defines: class members, ``__slots__``, ``x.attr = ...`` targets."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    for target in item.targets:
                        if isinstance(target, ast.Name):
                            names.add(target.id)
                            if target.id == "__slots__":
                                names.update(
                                    c.value
                                    for c in ast.walk(item.value)
                                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                                )
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
    return names


def test_layers_import_only_what_they_depend_on() -> None:
    assert set(DEPENDS_ON) == {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    violations = []
    for path, package in _modules():
        if SRC not in path.parents or path.parent == SRC:
            continue
        layer = path.relative_to(SRC).parts[0]
        allowed = _reachable(layer)
        for module, _ in _imports(path, package):
            target = _layer(module)
            if target is not None and target not in allowed:
                violations.append(f"{path.relative_to(PACKAGE)} ({layer}) imports {module}")
    assert not violations, "\n".join(violations)


def test_no_cross_module_private_names() -> None:
    trees = {path: ast.parse(path.read_text()) for path, _ in _modules()}
    own = {path: _attribute_names(tree) for path, tree in trees.items()}
    ours = set().union(*own.values())
    found: set[tuple[str, str]] = set()
    lines: list[str] = []
    for path, package in _modules():
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(trees[path]):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and _absolute(node, package).startswith("monarch"):
                names = [a.name for a in node.names if _private(a.name)]
            elif isinstance(node, ast.Attribute) and _private(node.attr):
                if node.attr in ours and node.attr not in own[path]:
                    names = [node.attr]
            for name in names:
                found.add((rel, name))
                if (rel, name) not in ALLOWED:
                    lines.append(f"{rel}:{node.lineno} uses {name}, private to another module")
    assert not lines, "give these a public-internal name or method:\n" + "\n".join(lines)
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"ALLOWED entries that no longer match anything (remove them): {stale}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if path.name == "__init__.py" else parts)


def _targets(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> list[str]:
    """The modules of ours an import statement loads (``from pkg import mod`` loads ``pkg.mod``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    module = _absolute(node, package)
    found = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
    return found or ([module] if module in known else [])


def _import_sites(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import and whether it runs at module level (not in a function, not TYPE_CHECKING)."""

    def walk(nodes: list[ast.stmt], top: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, top
            elif isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
                yield from walk(node.orelse, top)
            else:
                inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                for field in ("body", "orelse", "finalbody", "handlers"):
                    yield from walk([n for n in getattr(node, field, []) if isinstance(n, ast.AST)], inner)

    yield from walk(tree.body, True)


def _module_graph() -> tuple[dict[str, set[str]], list[str]]:
    """Module-level imports between modules of ours, and unexplained upward local imports."""
    sources = {_module_name(path): (path, package) for path, package in _modules()}
    known = set(sources)
    graph: dict[str, set[str]] = {name: set() for name in known}
    rank = {f"monarch._src.actor.{m}": i for i, m in enumerate(ACTOR_ORDER)}
    unexplained = []
    for name, (path, package) in sources.items():
        text = path.read_text()
        lines = text.splitlines()
        for node, top in _import_sites(ast.parse(text)):
            for target in _targets(node, package, known):
                if target == name:
                    continue
                if top:
                    graph[name].add(target)
                elif name in rank and rank.get(target, -1) > rank[name] and "#" not in lines[node.lineno - 1]:
                    unexplained.append(f"{path.relative_to(PACKAGE)}:{node.lineno} imports {target}")
    return graph, unexplained


def test_actor_modules_import_in_order() -> None:
    actor = {p.stem for p in (SRC / "actor").glob("*.py") if p.name != "__init__.py"}
    assert set(ACTOR_ORDER) == actor, "list every module of _src/actor/ in ACTOR_ORDER, once"
    assert len(ACTOR_ORDER) == len(actor)
    graph, unexplained = _module_graph()
    violations = []
    for i, module in enumerate(ACTOR_ORDER):
        for target in sorted(graph[f"monarch._src.actor.{module}"]):
            other = target.removeprefix("monarch._src.actor.")
            if other in ACTOR_ORDER and ACTOR_ORDER.index(other) > i:
                violations.append(f"_src/actor/{module}.py imports the later {other} at module level")
    assert not violations, "\n".join(violations)
    assert not unexplained, "a function-local import of a later module needs a reason comment:\n" + "\n".join(
        unexplained
    )


def test_no_import_cycle_at_module_level() -> None:
    graph, _ = _module_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        state[module] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            assert cycle is None, "import cycle at module level: " + " -> ".join(cycle)


def test_public_names_import() -> None:
    actor = importlib.import_module("monarch.actor")
    for name in actor.__all__:
        assert getattr(actor, name) is not None, name


def test_import_monarch_actor_stays_light() -> None:
    # torch never; the event loop, sockets and subprocesses only once the runtime starts, so
    # that a script pays for them when it uses them (and `--help` of a tool stays fast).
    heavy = ["torch", "asyncio", "socket", "subprocess"]
    code = f"import sys, monarch.actor; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
