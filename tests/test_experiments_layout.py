"""experiments/: one module per concern, imports one way down the layers docs/DESIGN.md states, every module in
its module -> tests table, and no test reaching into a module's private names."""

import ast
import re

import pytest

from tests.conftest import ROOT

EXP = ROOT / "experiments"
#: docs/DESIGN.md "experiments/: one owner per concern", top to bottom
LAYERS = [("math_8b", "scout_moe", "loo"), ("cli",), ("run_path",), ("base_models", "report", "store"), ("presets",),
          ("budgets", "preflight", "numerics")]
LAYER = {m: i for i, names in enumerate(LAYERS) for m in names}


def _experiments_imports(path) -> set[str]:
    """The modules of experiments/ that ``path`` imports anywhere (top level or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("scalerl_jax.experiments."):
                found.add(node.module.split(".")[2])
            elif node.module == "scalerl_jax.experiments":
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("scalerl_jax.experiments."))
    return found


def test_every_module_has_a_layer_and_common_is_gone():
    modules = {p.stem for p in EXP.glob("*.py")} - {"__init__"}
    assert modules == set(LAYER), modules ^ set(LAYER)


@pytest.mark.parametrize("module", sorted(LAYER))
def test_imports_run_down_the_layers(module):
    below = {m for m in _experiments_imports(EXP / f"{module}.py") if LAYER[m] <= LAYER[module]}
    assert not below, f"{module} imports {below}, which are not in a layer below it"


def test_the_design_doc_lists_every_module_and_its_tests():
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design.split("## experiments/: one owner per concern")[1].split("\n## ")[0]
    table = section.split("| module | tests |")[1]
    for module in LAYER:
        assert f"`{module}.py`" in table, module
    for test in set(re.findall(r"`(test_\w+\.py)`", table)):
        assert (ROOT / "tests" / test).is_file(), test


def test_no_test_imports_a_private_name_of_experiments():
    bad = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scalerl_jax.experiments"):
                bad += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
                if node.module == "scalerl_jax.experiments":
                    modules.update(a.asname or a.name for a in node.names)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and node.attr.startswith("_")):
                bad.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not bad, bad
