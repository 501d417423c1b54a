"""Shared test fixtures. Tests run on CPU; multi-device checks run in subprocesses with their own XLA_FLAGS.

Compiled programs are shared across the whole run: every JAX process of the suite (this one, the experiment runs,
servers and fleets the tests start) reads and writes one persistent XLA compilation cache, so a program compiled
once (the smoke preset's train step, the servers' decode loops) is loaded, not recompiled, by the next process that
needs it. The cache is a fresh directory per run (a clean clone's CI pays every compile once), removed at the end;
set ``JAX_COMPILATION_CACHE_DIR`` to keep one across runs.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Implicit rank promotion hides shape bugs ([B, T] + [T] broadcasting where [B, T] + [B, 1] was meant): every test,
# and every subprocess a test starts (they inherit the environment), runs with it off.
os.environ["JAX_NUMPY_RANK_PROMOTION"] = "raise"
if "jax" in sys.modules:  # a plugin imported JAX before this file: the variable was read already
    sys.modules["jax"].config.update("jax_numpy_rank_promotion", "raise")
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"  # math sets carried in the repository (data/README.md); tests fail, not skip, without them

_OWN_CACHE = pytest.StashKey[str]()


def pytest_configure(config):
    # Before any test module imports JAX: JAX reads these variables when it is imported, and every subprocess
    # inherits them. Compiles of any length are kept (JAX's default skips those under a second, a threshold that
    # then depends on the machine's load).
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        os.environ["JAX_COMPILATION_CACHE_DIR"] = config.stash[_OWN_CACHE] = tempfile.mkdtemp(
            prefix="scalerl_jax_xla_cache_")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    if "jax" in sys.modules:
        jax = sys.modules["jax"]
        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


def pytest_unconfigure(config):
    own = config.stash.get(_OWN_CACHE, None)
    if own:
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def pallas_interpret() -> bool | None:
    """``interpret`` for the Pallas kernel tests (tests/test_kernel_*.py): None (interpret on CPU, compile on GPU)
    unless SCALERL_PALLAS_INTERPRET forces it (``kernels.interpret_from_env``; benchmarks/gpu_check.sh sets 0)."""
    from kernels import interpret_from_env

    return interpret_from_env()


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The whole smoke preset run once per session (warm start, RL, fit, report); its ``warmstart`` directory is
    the base model (``--model``) of the fleet, multi-process and fixed-prompt tests. SCALERL_SMOKE_RUN=DIR reuses
    a finished smoke run directory instead (for iterating on one test locally; CI always makes its own)."""
    if os.environ.get("SCALERL_SMOKE_RUN"):
        return Path(os.environ["SCALERL_SMOKE_RUN"])
    out = tmp_path_factory.mktemp("smoke")
    r = subprocess.run([sys.executable, "-m", "experiments.math_8b", "--preset", "smoke", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return out
