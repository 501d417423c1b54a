"""The code sandbox against hostile programs, under bubblewrap and under the rlimits fallback.

Every check is against a fact outside the code under test: a file that must not exist, a socket that must receive
no connection, processes that must still be alive or must be gone (found in /proc by a name the program gives
itself), a secret that must not come back, a wall-clock bound measured here.
"""

import dataclasses
import json
import os
import secrets
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from scalerl_jax.rewards.code import HEAD_BYTES, SandboxConfig
from scalerl_jax.rewards.code_pool import CodeJob, CodePool
from scalerl_jax.rewards.sandbox import Sandbox, SandboxError
from tests.conftest import HANG_S

# A program's CPU seconds do not depend on how busy the machine is; its wall clock does. The runs below are held to
# a CPU limit (what ends a busy loop) under a wall clock far longer than any of them needs on a loaded machine 4x
# slower than this one (a program that ends another way must never meet it); the wall clock itself is tested with a
# sleeping program, which it alone ends.
CPU_S = 1.5
WALL_S = 60.0
SWEEP_S = 30.0  # ending a run's processes and sweeping them: well under a second on an idle machine; hang guard
MAX_PROCS = 8
ROOT = os.geteuid() == 0
# Under the rlimits mode a non-root trainer shares its uid with the program; Landlock (and, where the kernel allows,
# pid and network namespaces) keeps its files, processes and the network out of reach. As root each interpreter gets
# a fresh uid as well.


@pytest.fixture(scope="module", params=["bwrap", "rlimits"])
def sandbox(request):
    cfg = SandboxConfig(timeout_s=WALL_S, cpu_s=CPU_S, memory_mb=512, max_procs=MAX_PROCS,
                        max_output_bytes=1 << 16, isolation=request.param)
    try:
        return Sandbox(cfg)
    except SandboxError as e:
        if request.param == "bwrap":
            pytest.skip(f"bubblewrap cannot start on this machine: {e}")
        raise


def _named(marker: str) -> list[int]:
    """Pids of live processes whose name (comm) is ``marker``."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().strip() == marker:
                    with open(f"/proc/{d}/stat") as g:
                        if g.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _gone(marker: str, within_s: float = SWEEP_S) -> bool:
    deadline = time.monotonic() + within_s
    while _named(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _name_self(marker: str) -> str:
    """Program text that renames the running process (and so every child it forks) to ``marker``."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n"


def _timed(sb: Sandbox, program: str, tests: str = "pass\n", entry_point=None):
    t0 = time.monotonic()
    r = sb.run(program, tests, entry_point)
    return r, time.monotonic() - t0


def test_correct_passes_and_wrong_fails_with_the_assert_message(sandbox):
    prog = "def add(a, b):\n    return a + b\n"
    tests = "assert add(2, 3) == 5, 'add(2, 3) should be 5'\nassert add(-1, 1) == 0\n"
    r = sandbox.run(prog, tests)
    assert (r.passed, r.reason, r.isolation) == (True, "passed", sandbox.isolation)
    r = sandbox.run("def add(a, b):\n    return a - b\n", tests)
    assert (r.passed, r.reason) == (False, "failed")
    assert "add(2, 3) should be 5" in r.detail and "tests.py line 1" in r.detail
    r = sandbox.run(prog, "def check(candidate):\n    assert candidate(1, 1) == 3\n", "add")
    assert (r.passed, r.reason) == (False, "failed") and "assert candidate(1, 1) == 3" in r.detail


def test_tests_reach_the_programs_values_modules_functions_and_exceptions(sandbox):
    prog = ("import math as m\nLIMIT = [1, (2, 3), {'k': b'v'}]\n"
            "def f(x, scale=1):\n    if x < 0:\n        raise ValueError('negative input')\n"
            "    return m.sqrt(x) * scale\n")
    tests = ("assert LIMIT == [1, (2, 3), {'k': b'v'}]\nassert m.isclose(f(4.0, scale=2), 4.0)\n"
             "assert f(4) == 2\n"  # 2.0 == 2: ints and floats compare by value
             "try:\n    f(-1)\nexcept ValueError as e:\n    assert 'negative input' in str(e)\nelse:\n"
             "    assert False, 'no exception crossed'\n")
    r = sandbox.run(prog, tests)
    assert r.passed, r
    # exact types: a tuple is not a list, a bool not an int (Python's own == says True == 1)
    for ret, expected in (("(1, 2)", "[1, 2]"), ("True", "1"), ("1", "True"), ("[True]", "[1]")):
        r = sandbox.run(f"def g():\n    return {ret}\n", f"assert g() == {expected}\n")
        assert (r.passed, r.reason) == (False, "failed"), (ret, expected, r)
        r = sandbox.run(f"def g():\n    return {ret}\n", f"assert g() != {expected}\n")
        assert r.passed, (ret, expected, r)


def test_a_program_cannot_supply_or_swap_the_tests_check(sandbox):
    tests = "def check(candidate):\n    assert candidate() == 1, 'the real check ran'\n"
    r = sandbox.run("def f():\n    return 2\ndef check(candidate):\n    pass\n", "x = 1\n", "f")
    assert (r.passed, r.detail) == (False, "the tests define no check(candidate)")
    swapper = ("import threading\ndef f():\n    return 2\ndef swap():\n    while True:\n"
               "        globals()['check'] = lambda candidate: None\n"
               "threading.Thread(target=swap, daemon=True).start()\n")
    r = sandbox.run(swapper, tests, "f")
    assert not r.passed and "the real check ran" in r.detail, r


def test_infinite_loop_is_killed_on_time_and_leaves_nothing(sandbox):
    marker = f"loop{secrets.token_hex(4)}"
    # the wall clock at the CPU limit: a busy loop meets the clock first (its CPU seconds never outrun the clock's),
    # however loaded the machine
    r, dt = _timed(Sandbox(dataclasses.replace(sandbox.config, timeout_s=CPU_S)),
                   _name_self(marker) + "while True:\n    pass\n")
    assert (r.passed, r.reason) == (False, "timeout") and "wall clock" in r.detail, r
    assert dt < WALL_S
    assert _gone(marker)


def test_a_sleeping_program_is_killed_by_the_wall_clock(sandbox):
    marker = f"nap{secrets.token_hex(4)}"
    clock = dataclasses.replace(sandbox.config, timeout_s=2.0)
    r, dt = _timed(Sandbox(clock), _name_self(marker) + "import time\ntime.sleep(1000)\n")
    assert (r.passed, r.reason) == (False, "timeout") and "wall clock" in r.detail, r
    assert clock.timeout_s <= dt < WALL_S  # not before its clock; then killed, however slow the machine
    assert _gone(marker)


def test_a_cpu_bound_program_is_stopped_by_the_cpu_limit_and_says_so(sandbox):
    """With a wall clock far away (WALL_S), a loop ends by the 1 s CPU limit, graded as that limit, in every mode
    (the rlimits mode's interpreter is a pid namespace's init, which the soft limit's SIGXCPU does not end)."""
    patient = Sandbox(dataclasses.replace(sandbox.config, timeout_s=WALL_S, cpu_s=1.0))
    r, dt = _timed(patient, "while True:\n    pass\n")
    assert (r.passed, r.reason, r.detail) == (False, "timeout", "over the 1 s CPU limit"), r
    assert dt < WALL_S


def test_fork_bomb_is_bounded_by_the_process_limit_and_killed(sandbox):
    marker = f"bomb{secrets.token_hex(4)}"
    prog = _name_self(marker) + "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n" \
                                "        pass\n"
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], len(_named(marker)))
            time.sleep(0.02)

    t = threading.Thread(target=watch)
    t.start()
    # a short wall clock: processes that die at their CPU limit are replaced by fresh ones, so only the clock (or
    # the process limit's crash) ends a fork bomb; either ending is the test's
    bomb_box = Sandbox(dataclasses.replace(sandbox.config, timeout_s=CPU_S))
    try:
        r, dt = _timed(bomb_box, prog)
    finally:
        done.set()
        t.join()
    assert not r.passed and r.reason in ("timeout", "crash"), r
    assert dt < WALL_S
    assert 1 <= peak[0] <= MAX_PROCS + 2, f"{peak[0]} processes named {marker} at once"
    assert _gone(marker)


def test_allocating_8gb_fails_as_memory(sandbox):
    r, dt = _timed(sandbox, "x = bytearray(8 * 1024 ** 3)\nx[-1] = 1\n")
    assert (r.passed, r.reason) == (False, "memory"), r
    assert dt < WALL_S


def test_memory_spread_over_processes_is_capped_for_the_whole_run(sandbox):
    marker = f"mem{secrets.token_hex(4)}"
    prog = _name_self(marker) + ("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n"
                                 "        b = b'x' * (300 << 20)\n        time.sleep(30)\ntime.sleep(30)\n")
    # Each process stays under RLIMIT_AS (512 MB); together they hold ~900 MB. A long CPU limit as well, so that
    # slow page faults cannot turn this into a timeout.
    patient = Sandbox(dataclasses.replace(sandbox.config, cpu_s=20.0))
    r, dt = _timed(patient, prog)
    assert (r.passed, r.reason) == (False, "memory"), r
    assert dt < WALL_S
    assert _gone(marker)


def test_writing_outside_the_scratch_dir_leaves_no_file(sandbox, tmp_path):
    target = tmp_path / "escaped.txt"
    r = sandbox.run(f"open({str(target)!r}, 'w').write('escaped')\n", "pass\n")
    assert not r.passed and r.reason == "failed" and ("FileNotFoundError" in r.detail or "Permission" in r.detail)
    assert not target.exists()
    if sandbox.isolation == "bwrap":  # the sandbox's /tmp is its own tmpfs: a write there never reaches the host
        host_tmp = f"/tmp/scalerl_escape_{secrets.token_hex(6)}"
        r = sandbox.run(f"open({host_tmp!r}, 'w').write('escaped')\nimport os\nassert not os.path.exists('/work')\n",
                        "assert False, 'not a solution'\n")
        assert not r.passed and "not a solution" in r.detail
        assert not os.path.exists(host_tmp)
        for where in ("/", "/dev", "/usr/lib"):  # outside the capped tmpfs everything is read-only
            r = sandbox.run(f"open({where + '/x'!r}, 'w')\n", "pass\n")
            assert r.reason == "failed" and "Read-only file system" in r.detail, r
        r = sandbox.run("for k in range(64):\n    open(f'f{k}', 'wb').write(bytes(1 << 20))\n", "pass\n")
        assert r.reason == "failed" and "No space left" in r.detail, r  # the scratch tmpfs is capped


def test_no_connection_reaches_a_listening_socket(sandbox):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        prog = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                "s.sendall(b'hello')\n")
        r = sandbox.run(prog, "pass\n")
        assert not r.passed and r.reason == "failed", r
        assert any(e in r.detail for e in ("Network is unreachable", "Permission denied", "Connection refused")), r
        srv.settimeout(0.5)
        with pytest.raises(TimeoutError):
            srv.accept()


def test_a_secret_outside_the_sandbox_does_not_come_back(sandbox, tmp_path):
    secret = secrets.token_hex(16)
    path = tmp_path / "secret.txt"
    path.write_text(secret)
    r = sandbox.run(f"data = open({str(path)!r}).read()\nprint(data)\nraise ValueError(data)\n", "pass\n")
    assert not r.passed
    assert secret not in r.stdout + r.stderr + r.detail


def test_killing_the_parent_harms_nobody_outside(sandbox):
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        prog = ("import os, signal\n"
                f"for pid in (os.getppid(), {os.getpid()}, {helper.pid}, 1, -1):\n"
                "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print(pid, e)\n")
        r, dt = _timed(sandbox, prog, "assert solve() == 1\n")
        assert not r.passed and r.reason in ("failed", "crash"), r
        assert dt < WALL_S
        time.sleep(0.2)
        assert helper.poll() is None, "a process outside the sandbox was killed"
    finally:
        helper.kill()
        helper.wait()
    # the trainer (this process) is alive by construction; one more run proves the sandbox still works
    assert sandbox.run("x = 1\n", "assert x == 1\n").passed


def test_100mb_on_stdout_is_cut_off(sandbox):
    r, dt = _timed(sandbox, "import sys\nsys.stdout.write('x' * (100 << 20))\nsys.stdout.flush()\n")
    assert (r.passed, r.reason) == (False, "output_limit"), r
    assert dt < WALL_S
    assert len(r.stdout) <= HEAD_BYTES


FAKE = ('import os, sys\n'
        'line = b\'{"passed": true, "reason": "passed", "seconds": 0.0}\\npassed\\n\'\n'
        'os.write(1, line); os.write(2, line)\n'
        'for fd in range(3, 64):\n'
        '    try:\n        os.write(fd, b"0" * 32 + b"\\tpassed\\t\\n" + line)\n    except OSError:\n        pass\n')


@pytest.mark.parametrize("ending", ["os.close(1); os.close(2); os._exit(0)",
                                    "null = os.open('/dev/null', os.O_WRONLY); os.dup2(null, 1); print('passed')",
                                    "sys.exit(0)"])
def test_fake_passed_lines_and_early_exits_do_not_pass(sandbox, ending):
    r = sandbox.run(FAKE + ending + "\n", "assert False, 'the tests ran and failed'\n")
    assert not r.passed and r.reason in ("failed", "crash"), r


def test_cli_prints_one_json_object(tmp_path, capsys):
    from scalerl_jax.rewards.code import main

    prog, tests = tmp_path / "p.py", tmp_path / "t.py"
    prog.write_text(FAKE + "os.close(1); os._exit(0)\n")
    tests.write_text("assert False\n")
    cmd = [sys.executable, "-m", "scalerl_jax.rewards.code", "--program", str(prog), "--tests", str(tests),
           "--timeout", "5"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # exactly one JSON document: the program's fake lines never reach this stdout
    # crash (it exited) or failed (its fake lines reached the tests process as a malformed reply): never passed
    assert out["passed"] is False and out["reason"] in ("crash", "failed") and out["isolation"] in ("bwrap", "rlimits")
    # the same entry point in process (the module import alone takes seconds on a loaded CPU)
    prog.write_text("def f():\n    return 7\n")
    tests.write_text("def check(candidate):\n    assert candidate() == 7\n")
    assert main(["--program", str(prog), "--tests", str(tests), "--entry-point", "f"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True
    for bad in (["--program", str(prog)], ["--program", str(tmp_path / "missing.py"), "--tests", str(tests)],
                ["--program", str(prog), "--tests", str(tests), "--timeout", "-1"]):
        with pytest.raises(SystemExit) as e:
            main(bad)
        assert e.value.code == 2


def test_pool_64_programs_with_a_quarter_looping_finish_in_bounded_time():
    cfg = SandboxConfig(timeout_s=WALL_S, cpu_s=1.0, workers=8, isolation="auto")
    marker = f"pool{secrets.token_hex(4)}"
    loop = _name_self(marker) + "while True:\n    pass\n"
    jobs = [CodeJob(loop if k % 4 == 0 else f"def f():\n    return {k}\n", "pass\n" if k % 4 == 0 else
                    f"assert f() == {k}\n") for k in range(64)]
    with CodePool(cfg) as pool:
        t0 = time.monotonic()
        results = pool.map(jobs)
        dt = time.monotonic() - t0
    assert len(results) == 64
    assert [r.reason for r in results] == ["timeout" if k % 4 == 0 else "passed" for k in range(64)]
    assert all("CPU limit" in r.detail for r in results[::4]), results[::4]  # the loops end at their CPU limit
    # a hang guard from the work's CPU seconds, not a speed check: the 16 loops' 1 s each and the 48 short runs'
    # ~0.5 s (interpreter start-up in the sandbox) on 2 cores take ~20 s, and 4x that for a machine 4x slower; loops
    # that ran to their 60 s wall clock instead (2 rounds on 8 workers) would take longer
    assert dt < 4 * (16 * 1.0 + 48 * 0.5) / 2, dt
    assert _gone(marker)


def test_auto_falls_back_loudly_and_says_so(monkeypatch, caplog):
    import scalerl_jax.rewards.sandbox as sb

    monkeypatch.setattr(sb, "find_bwrap", lambda: "/bin/false")  # a "bwrap" that cannot start anything
    with caplog.at_level("WARNING"):
        s = Sandbox(SandboxConfig(isolation="auto"))
    assert s.isolation == "rlimits"
    assert any("CODE SANDBOX DEGRADED" in rec.message for rec in caplog.records)
    assert s.run("x = 1\n", "assert x == 1\n").isolation == "rlimits"
    with pytest.raises(SandboxError):
        Sandbox(SandboxConfig(isolation="bwrap"))


def test_a_shared_pool_times_jobs_from_pickup_not_from_the_other_callers_queue(monkeypatch):
    import scalerl_jax.rewards.code_pool as cp

    # A 1 s allowance past each job's own 6 s clock: measured from submission, the evaluation batch below would
    # wait behind 8 rounds of 1.5 s training jobs on 2 workers (12 s at the least, more on a slower machine) and come
    # back as sandbox errors. Each training job needs 1.5 s and its start-up, well within its clock.
    monkeypatch.setattr(cp, "_LOST_AFTER_S", 1.0)
    cfg = SandboxConfig(timeout_s=6.0, cpu_s=6.0, workers=2, isolation="auto")
    slow = CodeJob("import time\ntime.sleep(1.5)\ndef f():\n    return 1\n", "assert f() == 1\n")
    with CodePool(cfg) as pool:
        train: list = []
        t = threading.Thread(target=lambda: train.extend(pool.map([slow] * 16)))
        t.start()
        time.sleep(0.2)  # the training batch is queued first
        t0 = time.monotonic()
        evaluation = pool.map([CodeJob(f"def f():\n    return {k}\n", f"assert f() == {k}\n") for k in range(2)])
        waited = time.monotonic() - t0
        t.join()
        stats = pool.stats()
    assert waited > cfg.timeout_s + 2.0 + cp._LOST_AFTER_S  # longer than a whole batch of one round was allowed
    assert [r.reason for r in evaluation] == ["passed"] * 2
    assert [r.reason for r in train] == ["passed"] * 16
    assert (stats["runs"], stats["passed"], stats["sandbox_error"], stats["lost"]) == (18, 18, 0, 0)


def test_a_lost_worker_is_a_counted_sandbox_error(monkeypatch):
    import scalerl_jax.rewards.code_pool as cp

    release, came_back = threading.Event(), threading.Event()

    class Wedged:  # a sandbox whose run never comes back in time (a bug in the machinery, not a slow program)
        config = SandboxConfig(timeout_s=0.2, workers=1)
        isolation = "bwrap"

        def run(self, program, tests, entry_point=None):
            release.wait(HANG_S)  # held until the pool has given the job up: no race with a loaded machine's clock
            came_back.set()
            raise RuntimeError("wedged")

    # the pool gives the job up 0.2 + 0.3 s after a worker took it; the worker comes back only after that
    monkeypatch.setattr(cp, "_LOST_AFTER_S", 0.3)
    with CodePool(sandbox=Wedged()) as pool:
        r = pool.map([CodeJob("x = 1\n", "pass\n")])[0]
        assert not came_back.is_set()
        assert (r.passed, r.reason) == (False, "sandbox_error") and "after it started the job" in r.detail
        release.set()  # the worker comes back: its late failure is not counted twice
    assert came_back.is_set()  # closing the pool waited for the worker, its bookkeeping included
    stats = pool.stats()
    assert (stats["runs"], stats["sandbox_error"], stats["lost"], stats["error_rate"]) == (1, 1, 1, 1.0)


def test_real_presets_refuse_to_run_code_without_bubblewrap(monkeypatch):
    from scalerl_jax.experiments.presets import build_plan

    import scalerl_jax.rewards.sandbox as sb

    assert {p: build_plan(p).exp.sandbox.isolation for p in ("8b", "scout", "tiny", "tiny_mathcode", "small")} == {
        "8b": "bwrap", "scout": "bwrap", "tiny": "auto", "tiny_mathcode": "auto", "small": "auto"}
    monkeypatch.setattr(sb, "find_bwrap", lambda: "/bin/false")  # a machine where bubblewrap cannot start
    with pytest.raises(SandboxError, match="bwrap"):
        Sandbox(SandboxConfig(isolation=build_plan("8b").exp.sandbox.isolation))


def test_a_trainer_killed_mid_run_leaves_no_sandboxed_process():
    """A trainer process runs a program with a daemon under each isolation (bwrap, rlimits, rlimits without
    namespaces) at once and is SIGKILLed mid-run: nothing of the runs may survive it."""
    marker = f"orph{secrets.token_hex(3)}"
    trainer = textwrap.dedent("""
        import sys, threading
        import scalerl_jax.rewards.sandbox as sb
        from scalerl_jax.rewards.code_types import SandboxConfig
        boxes = {}
        for mode in ("bwrap", "rlimits", "rlimits-nons"):
            sb.NAMESPACES = mode != "rlimits-nons"
            try:
                boxes[mode] = sb.Sandbox(SandboxConfig(isolation=mode.split("-")[0], timeout_s=60, cpu_s=60))
            except sb.SandboxError:
                pass
        print(" ".join(boxes), flush=True)
        for k, (mode, box) in enumerate(boxes.items()):
            prog = sys.argv[1].replace("NAME", f"{sys.argv[2]}{k}")
            threading.Thread(target=box.run, args=(prog, "pass\\n")).start()
        """)
    prog = ("import ctypes, os, time\nctypes.CDLL(None).prctl(15, b'NAME', 0, 0, 0)\nif os.fork() == 0:\n"
            "    os.setsid()\n    time.sleep(60)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", trainer, prog, marker], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        modes = proc.stdout.readline().split()
        assert "rlimits" in modes and "rlimits-nons" in modes, proc.communicate(timeout=60)[1][-2000:]
        deadline = time.monotonic() + 300  # a hang guard: three sandboxes start on a loaded machine
        while len(_named_prefix(marker)) < 2 * len(modes) and time.monotonic() < deadline:  # programs and daemons
            time.sleep(0.05)
        assert len(_named_prefix(marker)) == 2 * len(modes), f"not all started: {_named_prefix(marker)}"
    finally:
        proc.kill()  # SIGKILL: the trainer cleans up nothing itself
        proc.wait()
    deadline = time.monotonic() + SWEEP_S
    while _named_prefix(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _named_prefix(marker), f"left behind (by mode index, {modes}): {_named_prefix(marker)}"


def _named_prefix(prefix: str) -> list[str]:
    """Names of live, non-zombie processes whose name starts with ``prefix``."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/comm") as f:
                name = f.read().strip()
            if name.startswith(prefix):
                with open(f"/proc/{d}/stat") as g:
                    if g.read().rsplit(")", 1)[1].split()[0] != "Z":
                        out.append(name)
        except (OSError, ValueError, IndexError):
            continue
    return out


class _BrokenMachinery(Sandbox):
    """The real sandbox, except that its machinery fails (raises) for programs marked BROKEN: what a missing
    bubblewrap binary or an exhausted host would look like from the pool."""

    def run(self, program, tests, entry_point=None):
        if "BROKEN" in program:
            raise OSError("the sandbox could not start its interpreter")
        return super().run(program, tests, entry_point)


@pytest.mark.parametrize("broken, stops", [(1, False), (3, True)])
def test_a_pool_whose_sandbox_errors_too_often_stops_the_run(broken, stops):
    """5 runs, ``broken`` of them sandbox errors: 1/5 = 20 % is under max_error_rate 25 % and scores on; 3/5 = 60 %
    raises SandboxUnhealthy naming the counts and the setting, instead of handing out -1 rewards."""
    from scalerl_jax.rewards.code_pool import SandboxUnhealthy

    cfg = SandboxConfig(isolation="none", timeout_s=20, cpu_s=20, workers=2)
    jobs = [CodeJob("# BROKEN\ndef f():\n    return 1\n" if i < broken else "def f():\n    return 1\n",
                    "assert f() == 1\n", None) for i in range(5)]
    with CodePool(sandbox=_BrokenMachinery(cfg), max_error_rate=0.25, min_runs=4) as pool:
        if stops:
            with pytest.raises(SandboxUnhealthy, match=r"3 of 5 sandboxed programs .*\(60% > sandbox.max_error_rate"):
                pool.map(jobs)
        else:
            results = pool.map(jobs)
            assert [r.reason for r in results] == ["sandbox_error"] + ["passed"] * 4
        s = pool.stats()
        assert (s["sandbox_error"], s["runs"]) == (broken, 5)


def test_the_kernels_cpu_limit_signal_reads_as_the_cpu_limit_whatever_the_rusage():
    """RLIMIT_CPU's SIGXCPU, seen by the launcher's wait4, is the CPU limit even when the rusage read after it is
    under the limit's margin (a loaded virtual machine's tick-sampled CPU time runs ahead of it); another signal
    with the same low reading stays a crash."""
    import signal

    from scalerl_jax.rewards.code_types import SandboxConfig, classify_run

    cfg = SandboxConfig(cpu_s=2.0)
    xcpu = classify_run(None, None, True, {"how": "signal", "signal": int(signal.SIGXCPU), "code": 0, "cpu": 1.2},
                        "rlimits", cfg, 1.3)
    assert (xcpu.passed, xcpu.reason, xcpu.detail) == (False, "timeout", "over the 2 s CPU limit")
    segv = classify_run(None, None, True, {"how": "signal", "signal": int(signal.SIGSEGV), "code": 0, "cpu": 1.2},
                        "rlimits", cfg, 1.3)
    assert (segv.passed, segv.reason) == (False, "crash")
