"""scalerl_jax/rollout/wire_schema.py: the names both sides of the SGLang API share, and the rules of the rollout
package written once (routes and extension field names as string literals only in wire_schema, pause modes and the
device-count rule defined once, the budget check in the config layer, the length-control rule in length_rule)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from scalerl_jax.config import completion_budget_error
from scalerl_jax.rollout import length_rule
from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.client import wire as sglang_wire
from scalerl_jax.rollout.server import wire as server_wire

ROOT = Path(__file__).resolve().parents[1]
ROLLOUT = sorted((ROOT / "scalerl_jax" / "rollout").rglob("*.py")) + [ROOT / "scalerl_jax" / "serve.py"]


def _name(path: Path) -> str:
    """``path`` under scalerl_jax/ (so that ``rollout/server/wire.py`` and ``rollout/client/wire.py`` differ)."""
    return path.relative_to(ROOT / "scalerl_jax").as_posix()


@functools.cache
def _tree(path: Path) -> ast.Module:
    """``path`` parsed, once per session. CPython 3.11 (3.11.7 on the development machine) keeps the AST converter's
    recursion depth in state its threads share (CPython issue 106905): a parse in another thread of the test
    process at the same moment fails this one with "AST constructor recursion depth mismatch" (seen once in a full
    suite run); parsing again is the workaround."""
    try:
        return ast.parse(path.read_text())
    except SystemError as e:
        if "recursion depth mismatch" not in str(e):
            raise
        return ast.parse(path.read_text())


def _code_strings(path: Path) -> list[str]:
    """String literals of ``path`` outside docstrings."""
    tree = _tree(path)
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def _definitions(name: str) -> list[str]:
    """Modules of the rollout package that define (def or assign) ``name`` at top level."""
    out = []
    for path in ROLLOUT:
        for node in _tree(path).body:
            targets = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
                       [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                       if isinstance(node, ast.Assign) else [])
            if name in targets:
                out.append(_name(path))
    return out


def test_routes_and_extension_names_are_written_only_in_wire_schema():
    routes = {ws.GENERATE, ws.UPDATE_WEIGHTS, ws.PAUSE, ws.CONTINUE, ws.ABORT, ws.WEIGHT_VERSION, ws.HEALTH,
              ws.MODEL_INFO, ws.SERVER_INFO, ws.SERVER_INFO_ALIAS, ws.STATS, *ws.ROUTER_WORKERS}
    names = {*ws.EXTENSIONS, *ws.LENGTH_FIELDS, ws.EXTENSIONS_KEY}  # ("device_count" is also a method name)
    found = {_name(p): sorted((routes | names) & set(_code_strings(p))) for p in ROLLOUT
             if _name(p) != "rollout/wire_schema.py"}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.parametrize("name", ["PAUSE_MODES", "EXTENSIONS", "devices_from_server_info", "SERVER_VERSION",
                                  "PH_ANSWER", "FIN_INTERRUPTED", "NO_BUDGET", "draw_budget", "stop_finish"])
def test_each_shared_name_is_defined_once(name):
    assert len(_definitions(name)) == 1, _definitions(name)


def test_both_sides_see_the_same_objects():
    assert server_wire.PAUSE_MODES is sglang_wire.PAUSE_MODES is ws.PAUSE_MODES
    assert server_wire.EXTENSIONS is ws.EXTENSIONS
    assert sglang_wire.devices_from_server_info is ws.devices_from_server_info
    assert not hasattr(server_wire, "parse_generate")  # dead: parse_generate_body is the parser


def test_rules_are_written_once_in_the_package():
    """The budget sum and the budget draw appear once in the package's code (config.py, length_rule.py)."""
    budget_sums, draws = [], []
    for path in [*sorted((ROOT / "scalerl_jax").rglob("*.py"))]:
        for node in ast.walk(_tree(path)):
            text = ast.unparse(node) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) else ""
            if "budget_hi" in text and "answer_budget" in text:
                budget_sums.append((path.name, node.lineno))
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("integers", "randint")) \
                    and "budget_lo" in ast.unparse(node):
                draws.append(path.name)
    assert [name for name, _ in sorted(set(budget_sums))] == ["config.py"]
    assert draws == [Path(length_rule.__file__).name]


def test_completion_budget_error():
    assert completion_budget_error(14, 8, 2, 4) is None  # 8 + 2 + 4 = 14 fits exactly
    msg = completion_budget_error(13, 8, 2, 4)
    assert msg is not None and "13" in msg and "= 14" in msg and "budget_hi 8" in msg


def test_devices_from_server_info():
    assert ws.devices_from_server_info({"device_count": 3, "tp_size": 8}) == 3  # ours first
    assert ws.devices_from_server_info({"tp_size": 2, "pp_size": 2, "dp_size": 2}) == 8
    assert ws.devices_from_server_info({"tp_size": 4, "dp_size": 4, "enable_dp_attention": True}) == 4
    for bad in (None, [], {}, {"device_count": 0}, {"device_count": True}, {"tp_size": 0}, {"tp_size": "2"}):
        assert ws.devices_from_server_info(bad) is None
