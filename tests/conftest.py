"""Shared test fixtures. Tests run on CPU; multi-device checks run in subprocesses with their own XLA_FLAGS.

Compiled programs are shared across the whole run: every JAX process of the suite (this one, the experiment runs,
servers and fleets the tests start) reads and writes one persistent XLA compilation cache, so a program compiled
once (the smoke preset's train step, the servers' decode loops) is loaded, not recompiled, by the next process that
needs it. The cache is a fresh directory per run (a clean clone's CI pays every compile once), removed at the end;
set ``JAX_COMPILATION_CACHE_DIR`` to keep one across runs.

``--cpu-durations N`` lists the N tests that used the most CPU time (user + system, this process and the
subprocesses it waited for): on a shared machine a clearer measure of a test's cost than ``--durations``' wall time.
"""

import os
import resource
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
# a hang guard for the smoke runs, not a speed limit: 1,600 s were measured for one on 2 cores shared with 5 other
# jobs (about 5 minutes alone)
SMOKE_TIMEOUT_S = 3000

_OWN_CACHE = pytest.StashKey[str]()


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N tests that used the most CPU time (user + system, the test process and the "
                          "subprocesses it waited for); 0 shows all")


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
    if config.getoption("cpu_durations") is not None:
        config.pluginmanager.register(CpuDurations(config.getoption("cpu_durations")), "cpu_durations")


def pytest_unconfigure(config):
    own = config.stash.get(_OWN_CACHE, None)
    if own:
        shutil.rmtree(own, ignore_errors=True)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class CpuDurations:
    """``--cpu-durations N``: each test's CPU seconds (setup, call and teardown; a module or session fixture's
    processes count where they are reaped), carried in its report, the N largest listed at the end."""

    def __init__(self, n: int):
        self.n, self.times, self.start = n, [], {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.start[item.nodeid] = cpu_seconds()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if call.when == "teardown" and item.nodeid in self.start:
            outcome.get_result().user_properties.append(("cpu_seconds", cpu_seconds() - self.start.pop(item.nodeid)))

    def pytest_runtest_logreport(self, report):
        cpu = dict(report.user_properties).get("cpu_seconds") if report.when == "teardown" else None
        if cpu is not None:
            self.times.append((cpu, report.nodeid))

    def pytest_terminal_summary(self, terminalreporter):
        if not self.times:
            return
        tr, times = terminalreporter, sorted(self.times, reverse=True)
        tr.write_sep("=", f"slowest {self.n or len(times)} CPU durations")
        for cpu, nodeid in times[:self.n or None]:
            tr.write_line(f"{cpu:9.1f}s cpu  {nodeid}")
        tr.write_line(f"{sum(c for c, _ in times):9.1f}s cpu  all {len(times)} tests (collection not counted)")


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
                       capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return out
