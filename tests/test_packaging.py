"""What the distribution installs (docs/DESIGN.md, "Import names"): one top-level import name, a wheel that works
without the source tree, and Hugging Face's packages importable beside the project from any directory."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from scalerl_jax import hostmem

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# the folder that installs under scalerl_jax from elsewhere in the repository ([tool.setuptools.package-dir]);
# benchmarks/ is imported as scalerl_jax.benchmarks in a checkout only (scalerl_jax/__init__.py) and not installed
MAPPED = {"scalerl_jax.experiments": "experiments"}
SCRIPTS = {"scalerl-run": "scalerl_jax.experiments.math_8b", "scalerl-moe": "scalerl_jax.experiments.scout_moe",
           "scalerl-loo": "scalerl_jax.experiments.loo", "scalerl-fit": "scalerl_jax.fit",
           "scalerl-prepare": "scalerl_jax.data.prepare", "scalerl-serve": "scalerl_jax.serve"}
STORED_RUN = ROOT / "results" / "loo_chain384" / "scalerl_s0"  # a finished run's small files (experiments/store.py)


def _packages_on_disk() -> set[str]:
    """Every folder holding an __init__.py under scalerl_jax/ and the mapped folders, as import names."""
    found = set()
    roots = {"scalerl_jax": ROOT / "scalerl_jax", **{name: ROOT / folder for name, folder in MAPPED.items()}}
    for name, top in roots.items():
        for init in top.rglob("__init__.py"):
            rel = init.parent.relative_to(top).parts
            found.add(".".join((name, *rel)))
    return found


def test_pyproject_lists_every_package_and_maps_the_top_level_folders():
    tool = PYPROJECT["tool"]["setuptools"]
    assert set(tool["packages"]) == _packages_on_disk()
    assert tool["package-dir"] == MAPPED
    assert {p.split(".")[0] for p in tool["packages"]} == {"scalerl_jax"}
    assert PYPROJECT["project"]["scripts"] == {k: f"{v}:main" for k, v in SCRIPTS.items()}
    assert set(hostmem.CONSOLE_SCRIPTS) == set(SCRIPTS)  # the scripts that restart with huge pages
    # the old top-level kernels package must not come back: from the repository root it hid Hugging Face's
    assert not list((ROOT / "kernels").glob("**/*.py"))


def test_no_module_imports_a_top_level_name_the_distribution_does_not_install():
    """Code imports experiments / benchmarks / kernels through scalerl_jax, so a wheel install (no repository on
    sys.path) finds every module, and a module is loaded once whichever way its command started."""
    bad = []
    for folder in ("scalerl_jax", "experiments", "benchmarks", "tests"):
        for f in (ROOT / folder).rglob("*.py"):
            for i, line in enumerate(f.read_text().splitlines(), 1):
                words = line.split()
                if len(words) >= 2 and words[0] in ("import", "from") and \
                        words[1].split(".")[0] in ("experiments", "benchmarks", "kernels"):
                    bad.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_a_checkout_without_an_install_finds_the_mapped_folders(tmp_path):
    """PYTHONPATH=<checkout> and no site-packages at all (``-S``: no editable install, as on the GPU machines'
    image): scalerl_jax.experiments and scalerl_jax.benchmarks are the checkout's folders, and the top-level names
    stay free."""
    code = ("import importlib.util as u, json, scalerl_jax.experiments as e, scalerl_jax.benchmarks as b\n"
            "print(json.dumps([e.__file__, b.__file__, u.find_spec('kernels') is None]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SCALERL_HUGEPAGES": "0"}
    r = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    exp, bench, no_kernels = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(exp) == ROOT / "experiments" / "__init__.py" and Path(bench) == ROOT / "benchmarks" / "__init__.py"
    assert no_kernels


HF_CLASSES = "LlamaForCausalLM, Llama4ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM"


@pytest.mark.parametrize("where", ["root", "elsewhere"])
def test_transformers_and_hf_kernels_import_beside_the_project(where, tmp_path):
    """transformers >= 5.25 imports Hugging Face's ``kernels`` package; from the repository root (where the
    documented commands run) and from another directory it must get that package, not a folder of ours."""
    code = ("import importlib.metadata, json, kernels, transformers\n"
            f"from transformers import {HF_CLASSES}\n"
            "import scalerl_jax.kernels.attention\n"
            "installed = importlib.metadata.distribution('kernels').locate_file('kernels/__init__.py')\n"
            "print(json.dumps({'kernels': kernels.__file__, 'installed': str(installed),\n"
            "                  'transformers': transformers.__version__}))")
    cwd = ROOT if where == "root" else tmp_path
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # the module imported is the file Hugging Face's distribution installed, not a folder of the working directory
    assert Path(out["kernels"]).resolve() == Path(out["installed"]).resolve(), out
    major, minor = (int(x) for x in out["transformers"].split(".")[:2])
    assert (major, minor) >= (5, 25), out  # the first release that imports Hugging Face's kernels package


@pytest.mark.lane
def test_a_wheel_installs_without_the_source_tree_and_its_scripts_run(tmp_path):
    """``pip wheel .`` -> a fresh venv in a temporary directory (its dependencies from this interpreter's
    site-packages through a .pth line, not the repository) -> the console scripts run from that directory."""
    # the environment of every command: no PYTHONPATH (the lane's names the repository, where pip would find the
    # source tree's egg-info and call the project installed already), no restart with huge pages (test_hostmem.py)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["SCALERL_HUGEPAGES"] = "0"
    # built from a copy of the tracked tree, so the build leaves nothing in the repository
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(wheels), str(src)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = wheels.glob("scalerl_jax-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"scalerl_jax"}
    for must in ("scalerl_jax/kernels/attention.py", "scalerl_jax/experiments/math_8b.py"):
        assert must in names, must
    assert not [n for n in names if n.startswith("scalerl_jax/benchmarks/")]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env, check=True, timeout=300)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                   "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  env=env, capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies (jax, numpyro, ...) from this interpreter's site-packages; a path a .pth file adds is not a
    # site directory, so the editable install's finder there is not loaded, and the wheel's copy comes first
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import scalerl_jax.experiments.math_8b as m, json, "
                            "importlib.util as u; print(json.dumps([m.__file__, "
                            "[u.find_spec(n) is not None for n in ('experiments', 'benchmarks', "
                            "'scalerl_jax.benchmarks')]]))"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert where.returncode == 0, where.stderr[-3000:]
    path, top_level = json.loads(where.stdout.strip().splitlines()[-1])
    assert Path(path).resolve().is_relative_to(purelib.resolve()), path
    assert top_level == [False, False, False]

    for script in SCRIPTS:
        r = subprocess.run([str(venv / "bin" / script), "--help"], cwd=work, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, (script, r.stderr[-3000:])
        assert "usage" in r.stdout.lower(), (script, r.stdout[:500])

    run = work / "stored"
    shutil.copytree(STORED_RUN, run, ignore=shutil.ignore_patterns("fit"))
    r = subprocess.run([str(venv / "bin" / "scalerl-fit"), str(run), "--fit-until", "0.5", "--out", str(work / "fit"),
                        "--num-samples", "200", "--num-chains", "1"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    pred = json.loads((work / "fit" / "summary.json").read_text())["runs"]["stored"]["prediction"]
    assert 0.0 <= pred["lo"] <= pred["mean"] <= pred["hi"] <= 1.0, pred  # a pass rate's interval, in order
