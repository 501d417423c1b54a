"""Shared test fixtures. Tests run on CPU; multi-device checks run in subprocesses with their own XLA_FLAGS.

Compiled programs are shared across the whole run: every JAX process of the suite (this one, the experiment runs,
servers and fleets the tests start) reads and writes one persistent XLA compilation cache, so a program compiled
once (the smoke preset's train step, the servers' decode loops) is loaded, not recompiled, by the next process that
needs it. The cache is a fresh directory per run (a clean clone's CI pays every compile once), removed at the end;
set ``JAX_COMPILATION_CACHE_DIR`` to keep one across runs.

``--cpu-durations N`` lists the N tests that used the most CPU time (user + system, this process and the
subprocesses it waited for): on a shared machine a clearer measure of a test's cost than ``--durations``' wall time.
"""

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
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
# a hang guard for one subprocess the tests wait for (the longest: a smoke-preset run or a two-process run, minutes
# alone), generous for a loaded machine 4x slower than this one; not a speed limit
HANG_S = 1800

#: XLA:CPU's LLVM back end at optimisation level 0. It compiles a tiny train step in about half the time and runs it
#: about 20 % slower: a gain where compiling is most of the cost (this process's tests, each compiling small programs
#: once or a few times; AOT and dry runs; one-step comparisons on simulated meshes), a loss where running is (whole
#: runs of many steps, NUTS chains, MoE dispatch: a Qwen3-MoE run took 9x longer). What a program computes is the
#: same at any level up to float reassociation, which every tolerance allows (tests/tolerances.py).
#: SCALERL_TEST_XLA_OPT=default keeps XLA's default level everywhere.
OPT0 = "--xla_backend_optimization_level=0"
#: the background checks (by name prefix) that compile far more than they run: they get OPT0 too
COMPILE_BOUND = ("aot_", "dry_run_", "moe_ep_", "variant_runs", "sharded", "loo_", "gpu_check_cpu_smoke")


def opt0_wanted() -> bool:
    return os.environ.get("SCALERL_TEST_XLA_OPT", "") != "default"


_OWN_CACHE = pytest.StashKey[str]()
_OWN_WARM = pytest.StashKey[str]()


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
    # XLA:CPU's LLVM back end at optimisation level 0 in this process (see OPT0); its subprocesses keep XLA's default
    # level, except the background checks named in COMPILE_BOUND (whole_runs)
    if opt0_wanted() and OPT0 not in os.environ.get("XLA_FLAGS", "") and "jax" not in sys.modules:
        before = os.environ.get("XLA_FLAGS")
        os.environ["XLA_FLAGS"] = f"{before or ''} {OPT0}".strip()
        import jax

        jax.jit(lambda x: x + 1)(1).block_until_ready()  # XLA reads XLA_FLAGS once, at its first client and compile
        if before is None:
            del os.environ["XLA_FLAGS"]
        else:
            os.environ["XLA_FLAGS"] = before
    # warm starts made by earlier runs on this machine are not reused (experiments/base_models.py): every test
    # session makes its own, as a clean clone's CI does; SCALERL_WARMSTART_CACHE=DIR keeps them across sessions
    if not os.environ.get("SCALERL_WARMSTART_CACHE"):
        os.environ["SCALERL_WARMSTART_CACHE"] = config.stash[_OWN_WARM] = tempfile.mkdtemp(
            prefix="scalerl_jax_warmstarts_")
    if "jax" in sys.modules:
        jax = sys.modules["jax"]
        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
    if config.getoption("cpu_durations") is not None:
        config.pluginmanager.register(CpuDurations(config.getoption("cpu_durations")), "cpu_durations")


WHOLE_RUN_FIXTURES = ("smoke_run", "smoke_moe_run")


IN_LANE = "SCALERL_IN_LANE"  # set in a test's own pytest process that the lane runs (``@pytest.mark.lane``)


@pytest.hookimpl(trylast=True)  # after -m / -k have deselected
def pytest_collection_modifyitems(session, config, items):
    """A test marked ``@pytest.mark.lane`` is replaced by a :class:`LaneTest` (its own pytest process in the
    background lane). Then the tests that wait for the background lane (``@pytest.mark.background``,
    ``@pytest.mark.lane``) go last, and before them the tests that read the whole runs (``smoke_run``,
    ``smoke_moe_run``), those needing only the first run (it finishes first) before those needing the second; every
    other test keeps its place. The runs and checks start in the background as the session starts, so the rest of
    the suite runs while they do and waits for the lane only when nothing else is left."""
    if not os.environ.get(IN_LANE):
        items[:] = [LaneTest.of(item) if item.get_closest_marker("lane") else item for item in items]

    def key(item):
        names = set(getattr(item, "fixturenames", ()))
        lane = item.get_closest_marker("background") is not None or isinstance(item, LaneTest)
        return (lane, *(n in names for n in reversed(WHOLE_RUN_FIXTURES)))

    items[:] = sorted(items, key=key)  # stable: the order within each group is pytest's own


def pytest_unconfigure(config):
    for key in (_OWN_CACHE, _OWN_WARM):
        own = config.stash.get(key, None)
        if own:
            shutil.rmtree(own, ignore_errors=True)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _background_cpu() -> float:
    return sum(run.cpu_seconds for run in BACKGROUND_RUNS)


class CpuDurations:
    """``--cpu-durations N``: each test's CPU seconds (setup, call and teardown; a module or session fixture's
    processes count where they are reaped, the background whole runs apart), carried in its report, the N largest
    listed at the end."""

    def __init__(self, n: int):
        self.n, self.times, self.start = n, [], {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.start[item.nodeid] = cpu_seconds() - _background_cpu()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if call.when == "teardown" and item.nodeid in self.start:
            used = cpu_seconds() - _background_cpu() - self.start.pop(item.nodeid)
            outcome.get_result().user_properties.append(("cpu_seconds", used))

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
        for run in BACKGROUND_RUNS:
            tr.write_line(f"{run.cpu_seconds:9.1f}s cpu  in the background: {' '.join(run.argv[2:-2])}")


SESSION_START = time.monotonic()


def pytest_terminal_summary(terminalreporter):
    """The background lane's timeline: when each run started and ended (seconds since the session started), and how
    long the tests waited for it: a lane that ends after the rest of the suite is what sets the suite's wall time."""
    runs = [r for r in BACKGROUND_RUNS if r.proc is not None]
    if not runs:
        return
    tr = terminalreporter
    tr.write_sep("=", "background lane (seconds since the session started)")
    for run in runs:
        end = f"{run.ended - SESSION_START:7.0f}" if run.ended else "      -"
        what = run.name if isinstance(run, BackgroundCheck) else " ".join(run.argv[2:-2])
        tr.write_line(f"{run.started - SESSION_START:7.0f} -> {end}  waited for {run.waited:6.1f}  {what}")
    tr.write_line(f"tests waited {sum(r.waited for r in runs):.0f} s for the lane in all")


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def pallas_interpret() -> bool | None:
    """``interpret`` for the Pallas kernel tests (tests/test_kernel_*.py): None (interpret on CPU, compile on GPU)
    unless SCALERL_PALLAS_INTERPRET forces it (``scalerl_jax.kernels.interpret_from_env``; benchmarks/gpu_check.sh sets
    0)."""
    from scalerl_jax.kernels import interpret_from_env

    return interpret_from_env()


class BackgroundRun:
    """One whole experiment run (``python -m MODULE ARGS --out DIR``) in a subprocess that may start before the
    test that needs it. ``start`` is idempotent; ``reap`` (the background thread's) waits for the process and keeps
    its CPU seconds; ``result`` starts the run if nobody has, waits for it and returns the run directory, or fails
    with the end of its log."""

    def __init__(self, module: str, args: list[str], out: Path):
        self.argv = [sys.executable, "-m", module, *args, "--out", str(out)]
        self.out, self.log = out, out.parent / f"{out.name}.log"
        self.proc: subprocess.Popen | None = None
        self.started, self.ended, self.waited, self.cpu_seconds, self.closed = 0.0, 0.0, 0.0, 0.0, False
        self.done = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self.proc is None and not self.closed:
                with open(self.log, "w") as f:  # the child keeps its own copy of the descriptor
                    self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
                self.started = time.monotonic()

    def reap(self) -> None:
        try:
            if self.proc is not None:
                _, status, usage = os.wait4(self.proc.pid, 0)
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.cpu_seconds = usage.ru_utime + usage.ru_stime
        finally:
            self.ended = time.monotonic()
            self.done.set()

    def wait(self) -> bool:
        """Wait for the process (at most SMOKE_TIMEOUT_S after its start); the time the tests waited is kept."""
        t0 = time.monotonic()
        done = self.done.wait(timeout=max(1.0, self.started + SMOKE_TIMEOUT_S - t0))
        self.waited += time.monotonic() - t0
        return done

    def result(self) -> Path:
        self.start()
        if not self.wait():
            self.close()
            raise AssertionError(f"{' '.join(self.argv[2:])} still running after {SMOKE_TIMEOUT_S} s: "
                                 f"{self.log.read_text()[-3000:]}")
        rc = self.proc.returncode
        assert rc == 0, f"{' '.join(self.argv[2:])} exited {rc}: {self.log.read_text()[-3000:]}"
        return self.out

    def close(self) -> None:
        with self._lock:
            self.closed = True
            if self.proc is not None and self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()


BACKGROUND_RUNS: list[BackgroundRun] = []  # CpuDurations counts their CPU apart from the test that reaped them


class BackgroundCheck(BackgroundRun):
    """A test's subprocess (``@pytest.mark.background(NAME, ARGV)``: ARGV after the Python executable, run in the
    repository root; ``{out}`` in it is replaced by a fresh directory) run in the background lane; ``result`` waits
    for it and returns the ``subprocess.CompletedProcess`` (stdout and stderr apart) that ``subprocess.run`` would
    have, for the test to check as it would its own."""

    def __init__(self, name: str, args: list[str], out: Path):
        super().__init__("", [], out)
        self.argv = [sys.executable, *(a.replace("{out}", str(out)) for a in args)]
        self.name, self.log, self.env, self.smoke = name, out / "stdout.txt", {}, None

    def start(self) -> None:
        with self._lock:
            if self.proc is None and not self.closed:
                path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
                with open(self.out / "stdout.txt", "w") as o, open(self.out / "stderr.txt", "w") as e:
                    self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=o, stderr=e,
                                                 env={**os.environ, "PYTHONPATH": path, **self.env})
                self.started = time.monotonic()

    def result(self) -> subprocess.CompletedProcess:
        self.start()
        if not self.wait():
            self.close()
            raise AssertionError(f"background check {self.name} still running after {SMOKE_TIMEOUT_S} s")
        return subprocess.CompletedProcess(self.argv, self.proc.returncode, (self.out / "stdout.txt").read_text(),
                                           (self.out / "stderr.txt").read_text())


class LaneTest(pytest.Function):
    """Stands in for a test marked ``@pytest.mark.lane`` (minutes of subprocesses, one core): the lane runs that test
    in a pytest process of its own (``SCALERL_IN_LANE=1``; after the smoke run, which it reads through
    ``SCALERL_SMOKE_RUN``), and this item passes or fails with it, showing that process's report when it fails."""

    @classmethod
    def of(cls, item: pytest.Function) -> "LaneTest":
        assert isinstance(item.parent, pytest.Module), f"{item.nodeid}: only a module's own tests can run in the lane"

        def in_lane(whole_runs):
            lane = whole_runs[f"lane:{item.nodeid}"]
            if lane.smoke is not None:
                lane.smoke.result()  # a failed smoke run fails here with its own log
            r = lane.result()
            if r.returncode != 0:
                raise LaneFailure(f"{item.nodeid} in its own pytest process (exit {r.returncode}):\n"
                                  f"{(r.stdout + r.stderr)[-6000:]}")
            last = (r.stdout.strip().splitlines() or [""])[-1]
            if "skipped" in last and "passed" not in last:  # skipped there: skipped here, with its reason
                pytest.skip(f"in its own pytest process: {r.stdout[-1000:]}")

        lane = cls.from_parent(item.parent, name=item.name, callobj=in_lane, keywords=item.keywords)
        lane.own_markers.extend(item.own_markers)
        lane.needs_smoke = "smoke_run" in item.fixturenames
        return lane

    def repr_failure(self, excinfo):
        return str(excinfo.value) if isinstance(excinfo.value, LaneFailure) else super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.name} (in the background lane)"


class LaneFailure(Exception):
    pass


@pytest.fixture(scope="session", autouse=True)
def whole_runs(request, tmp_path_factory):
    """The whole runs that this session's tests need (the smoke preset: ``smoke_run``; the MoE smoke preset:
    ``smoke_moe_run``), then the subprocess checks of the tests marked ``@pytest.mark.background`` (multi-device
    comparisons, AOT compiles: minutes of one process each), then the pytest processes of the tests marked
    ``@pytest.mark.lane`` (:class:`LaneTest`), started one after the other in the background as the session starts:
    the tests that run meanwhile (one at a time, mostly on one thread) leave a core idle."""
    wanted = {n for item in request.session.items for n in getattr(item, "fixturenames", ())}
    wanted |= {"smoke_run" for item in request.session.items if getattr(item, "needs_smoke", False)}
    runs: dict[str, BackgroundRun] = {}
    if "smoke_run" in wanted and not os.environ.get("SCALERL_SMOKE_RUN"):
        # the refit process at the run's own priority: at its default niceness (10) it can starve for the whole run
        # on a machine shared with other jobs, and the tests read its forecast rows
        runs["smoke"] = BackgroundRun("experiments.math_8b", ["--preset", "smoke", "--set", "forecast.nice=0"],
                                      tmp_path_factory.mktemp("smoke"))
    if "smoke_moe_run" in wanted:
        runs["smoke_moe"] = BackgroundRun("experiments.scout_moe", ["--preset", "smoke_moe", "--no-fit"],
                                          tmp_path_factory.mktemp("smoke_moe"))
    for item in request.session.items:
        for mark in item.iter_markers("background"):
            name, args = mark.args
            if f"check:{name}" not in runs:
                check = runs[f"check:{name}"] = BackgroundCheck(name, list(args),
                                                                tmp_path_factory.mktemp(f"check_{name}"))
                if opt0_wanted() and name.startswith(COMPILE_BOUND):
                    check.env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {OPT0}".strip()
    for item in request.session.items:
        if isinstance(item, LaneTest):
            out = tmp_path_factory.mktemp(f"lane_{item.name}"[:60])
            lane = runs[f"lane:{item.nodeid}"] = BackgroundCheck(
                item.nodeid, ["-m", "pytest", item.nodeid, "-q", "-p", "no:cacheprovider", "--basetemp",
                              str(out / "tmp")], out)
            lane.env[IN_LANE] = "1"
            if item.needs_smoke and "smoke" in runs:
                lane.smoke = runs["smoke"]
                lane.env["SCALERL_SMOKE_RUN"] = str(runs["smoke"].out)
    BACKGROUND_RUNS.extend(runs.values())

    def one_after_another():
        for run in runs.values():
            run.start()
            run.reap()

    reaper = threading.Thread(target=one_after_another, daemon=True)
    reaper.start()
    yield runs
    for run in reversed(runs.values()):  # the last first: a killed run must not let the thread start the next
        run.close()
    reaper.join(timeout=60)


@pytest.fixture(scope="session")
def smoke_run(whole_runs):
    """The whole smoke preset run once per session (warm start, RL, fit, report); its ``warmstart`` directory is
    the base model (``--model``) of the fleet, multi-process and fixed-prompt tests. SCALERL_SMOKE_RUN=DIR reuses
    a finished smoke run directory instead (for iterating on one test locally; CI always makes its own)."""
    if os.environ.get("SCALERL_SMOKE_RUN"):
        return Path(os.environ["SCALERL_SMOKE_RUN"])
    return whole_runs["smoke"].result()


def printed_json(r: subprocess.CompletedProcess):
    """What a background check's script printed as its last line (JSON), after checking that it exited 0."""
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def background(request, whole_runs) -> dict[str, subprocess.CompletedProcess]:
    """The finished subprocesses of this test's ``@pytest.mark.background(NAME, ARGV)`` marks, by NAME (see
    :class:`BackgroundCheck`)."""
    names = [m.args[0] for m in request.node.iter_markers("background")]
    assert names, "the background fixture needs @pytest.mark.background(NAME, ARGV) on the test"
    return {n: whole_runs[f"check:{n}"].result() for n in names}


@pytest.fixture(scope="session")
def smoke_moe_run(whole_runs):
    """The MoE smoke preset run once per session (its own warm start of the Llama-4-style model, RL, no fit)."""
    return whole_runs["smoke_moe"].result()
