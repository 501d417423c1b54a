"""scalerl_jax/rollout/'s layout: one concern per folder (engine/, server/, client/, fleet/), each a package whose
``__init__`` names its main classes, the shared modules (protocol, wire_schema, length_rule, orchestrator) at the
top, nothing left at the flat paths the folders replaced, and imports between the folders that run one way (only
the server uses another folder, the engine; the client and the fleet import no JAX)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import HANG_S
from tests.servers import ROOT
from tests.test_model_structure import _import_graph

ROLLOUT = ROOT / "scalerl_jax" / "rollout"
PKG = "scalerl_jax.rollout"
SHARED = {"length_rule", "orchestrator", "protocol", "wire_schema"}
FOLDERS = {  # folder -> (its modules, the names its __init__ exports)
    "engine": ({"decode", "driver", "rows", "sampling", "scheduler"}, {"EngineDriver", "JaxEngine"}),
    "server": ({"app", "wire"}, {"ServerInfo", "create_app"}),
    "client": ({"remote", "sglang", "weights", "wire"},
               {"GenerationError", "RemoteGenerator", "SGLangGenerator", "WeightVersionMismatch"}),
    "fleet": ({"guard", "local", "processes"}, {"FleetError", "LocalFleet"}),
}
#: the flat modules the folders replaced
OLD = ("decode", "engine", "fleet", "processes", "remote", "rows", "sampling", "server", "server_wire",
       "sglang_client", "sglang_weights", "sglang_wire")


def test_the_top_holds_only_the_shared_modules_and_the_folders():
    assert {p.stem for p in ROLLOUT.glob("*.py")} == SHARED | {"__init__"}
    assert {p.name for p in ROLLOUT.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(FOLDERS)
    for folder, (modules, _) in FOLDERS.items():
        assert {p.stem for p in (ROLLOUT / folder).glob("*.py")} == modules | {"__init__"}, folder
        assert not [p for p in (ROLLOUT / folder).iterdir() if p.is_dir() and p.name != "__pycache__"], folder


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_each_folder_is_a_package_that_names_its_main_classes(folder):
    pkg = importlib.import_module(f"{PKG}.{folder}")
    assert hasattr(pkg, "__path__") and (pkg.__doc__ or "").strip(), folder
    exports = FOLDERS[folder][1]
    assert set(pkg.__all__) == exports
    for name in exports:
        assert getattr(pkg, name).__module__.startswith(f"{PKG}.{folder}."), name


@pytest.mark.parametrize("old", OLD)
def test_nothing_is_left_at_the_old_flat_paths(old):
    assert not (ROLLOUT / f"{old}.py").exists()
    spec = importlib.util.find_spec(f"{PKG}.{old}")
    assert spec is None or spec.submodule_search_locations is not None  # engine, fleet, server: now the folders


def test_the_folders_import_one_way():
    """Within rollout/, a folder's modules import their own folder and the shared modules; the server also uses the
    engine. No folder imports the server, the client or the fleet."""
    graph = _import_graph("scalerl_jax")
    allowed = {"engine": set(), "server": {"engine"}, "client": set(), "fleet": set()}
    crossing = {}
    for mod, deps in graph.items():
        parts = mod.split(".")
        if mod.startswith(f"{PKG}.") and parts[2] in FOLDERS:
            others = {d.split(".")[2] for d in deps if d.startswith(f"{PKG}.")} - SHARED - {parts[2]}
            if others - allowed[parts[2]]:
                crossing[mod] = sorted(others)
    assert crossing == {}
    # the package itself imports nothing (no folder is loaded by importing another)
    assert graph[PKG] == set()


def test_the_client_and_the_fleet_import_no_jax():
    """The trainer's HTTP side and the fleet's processes stay light: the rule they share with the engine
    (length_rule) sits at the top, not in engine/, whose package loads JAX and the models."""
    code = ("import sys; import scalerl_jax.rollout.client, scalerl_jax.rollout.fleet; "
            "print(sorted(m for m in ('jax', 'scalerl_jax.models', 'scalerl_jax.rollout.engine') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
