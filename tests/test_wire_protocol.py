"""One module defines the wire protocol (monarch/_src/wire/protocol.py): no other module spells a
frame header key, and every frame kind has its own number."""

from __future__ import annotations

import ast
from pathlib import Path

from monarch._src.wire import protocol

SRC = Path(__file__).resolve().parent.parent / "monarch" / "_src"
PROTOCOL = SRC / "wire" / "protocol.py"


def _header_keys() -> set[str]:
    """The string value of every header key constant (upper-case ``str`` names of the module)."""
    return {v for k, v in vars(protocol).items() if k.isupper() and isinstance(v, str)}


def _spelled_keys(source: str, name: str, keys: set[str]) -> list[str]:
    """Places in ``source`` that write a header by hand: a dict display whose keys are all header
    key literals, or a subscript / ``.get`` / ``.pop`` / ``.setdefault`` with such a literal."""
    found = []

    def is_key(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in keys

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict) and node.keys and all(is_key(k) for k in node.keys):
            found.append(f"{name}:{node.lineno}: dict display with header keys")
        elif isinstance(node, ast.Subscript) and is_key(node.slice):
            found.append(f"{name}:{node.lineno}: subscript [{ast.unparse(node.slice)}]")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
            and is_key(node.args[0])
        ):
            found.append(f"{name}:{node.lineno}: .{node.func.attr}({ast.unparse(node.args[0])})")
    return found


def test_only_the_protocol_module_spells_header_keys() -> None:
    keys = _header_keys()
    assert {"k", "d", "e", "p", "r", "x"} <= keys  # the scan looks for the real keys
    found = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if path != PROTOCOL
        for hit in _spelled_keys(path.read_text(), str(path.relative_to(SRC)), keys)
    ]
    assert not found, (
        "frame header keys written by hand (use the builders and key constants of "
        "monarch._src.wire.protocol):\n" + "\n".join(found)
    )


def test_the_scan_finds_hand_written_headers() -> None:
    code = 'h = {"k": 1, "d": key}\nh["r"] = 3\nh.get("e")\nok = {"op": "opt", "name": 1}\n'
    assert len(_spelled_keys(code, "sample.py", _header_keys())) == 3


def test_every_kind_has_its_own_number() -> None:
    kinds = {k: v for k, v in vars(protocol).items() if k.endswith("_KIND")}
    assert sorted(kinds.values()) == sorted(protocol.KINDS), "KINDS must list every *_KIND"
    assert len(set(protocol.KINDS)) == len(protocol.KINDS), kinds
    assert set(protocol.FIELDS) == set(protocol.KINDS)


def test_each_kind_uses_distinct_keys_and_builders_use_them() -> None:
    for kind, fields in protocol.FIELDS.items():
        assert len(set(fields)) == len(fields), (kind, fields)
        assert protocol.KIND not in fields
    built = [
        protocol.message("a", "e", ["addr", 1], 0, [[], []]),
        protocol.spawn("a", "n", 0, [[], []], ("addr",), ["c", "c", "c"], ["addr", "o"], boot=True),
        protocol.port_value(1, 0, protocol.FLAG_EXCEPTION),
        protocol.stop_actor("a", ["addr", 1], 0, 1.0),
        protocol.stop_proc(),
        protocol.supervision("o", "m", "n", 0, "failed", stopped=True),
        protocol.log_lines("m", 1, "label", "[x=0] ", last=True),
        protocol.log_flush(["addr", 1], 0),
        protocol.log_option(["addr", 1], 0, protocol.log_options(True, "addr", "m", 20, "p")),
        protocol.host_hello(["addr", 1], "root", b"nonce"),
        protocol.forward("a", "e", ["addr", 1], [[], []], [[0, "addr", 0]], "addr", gather=True),
        protocol.port_batch(1, [[0, 1]]),
        protocol.rdma(protocol.RDMA_READ, 1, ["addr", 1], offset=1, length=2, timeout=3.0),
        protocol.peer_hello("addr", (3, 0, [[2, 1]], [[1, {"k": 6}]], 1), 7),
        protocol.messages_lost("addr", [["a", 3], [None, 1]], "why", uncertain=True),
        protocol.shm_give_back(["f"]),
    ]
    assert sorted(h[protocol.KIND] for h in built) == sorted(protocol.KINDS)
    for header in built:
        kind = header[protocol.KIND]
        assert set(header) - {protocol.KIND} == set(protocol.FIELDS[kind]), kind
