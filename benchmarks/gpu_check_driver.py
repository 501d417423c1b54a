"""The GPU check's driver: every section in its own process with its own timeout, the JSON rewritten after each.

``python -m benchmarks.gpu_check`` (no ``--section``) lands here. This process never imports JAX: it runs the
kernel tests as one ``pytest`` process and every other section as ``python -m benchmarks.gpu_check --section NAME``,
each in a new process group that is killed (the whole group) when its timeout passes. What a section process
reports it writes to a file of its own after every row, so a section killed half-way keeps the rows it finished.
After each section the JSON (``--out``) is rewritten in full (to a temporary file, then renamed), so a run stopped
from outside (SIGTERM or SIGINT: the running section is killed and reported; SIGKILL: nothing more is written)
keeps every section that finished.

Time: a section starts only if ``SECTION_MIN_S`` of it fits in what is left of ``--budget-s`` (else a ``skipped``
row); its timeout is what is left minus the minimums of the sections after it, capped at ``SECTION_MAX_S``. A
timeout, a crash (a non-zero exit without an error row) or a collection error in a kernel test file is one
``error`` row; the sections after it still run.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from scalerl_jax.benchmarks.gpu_check_report import ROOT, Report, Sizes

# minimum seconds a section needs to be started, and the most it may take (GPU estimates: compile + measured steps)
SECTION_MIN_S = {"kernel_tests": 30.0, "device": 15.0, "train": 90.0, "decode": 45.0, "impl": 40.0}
SECTION_MAX_S = {"kernel_tests": 240.0, "device": 90.0, "train": 240.0, "decode": 150.0, "impl": 200.0}


class Stopped(Exception):
    """SIGTERM or SIGINT arrived while a section ran."""


@dataclasses.dataclass
class ChildResult:
    returncode: int | None  # None: killed at its timeout
    wall_s: float
    stdout_tail: str
    stderr_tail: str


def run_child(cmd: list[str], env: dict, timeout_s: float, capture_stdout: bool) -> ChildResult:
    """Run ``cmd`` in a new process group; at ``timeout_s`` (or on :class:`Stopped`) kill the whole group.
    stderr is kept (its tail is returned); stdout goes to this process's stdout unless ``capture_stdout``."""
    with tempfile.TemporaryFile("w+") as err, tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out if capture_stdout else None, stderr=err,
                                text=True, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        wall = time.perf_counter() - t0
        err.seek(0)
        out.seek(0)
        return ChildResult(rc, wall, out.read()[-2000:], err.read()[-2000:])


def show_tail(what: str, text: str) -> None:
    """A failed child's last output on the console (its rows carry only one line of it)."""
    if text.strip():
        print(f"  --- last output of {what} ---\n{text.rstrip()}\n  ---", flush=True)


def tail_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def child_env(gpu: bool) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if not gpu:
        env["JAX_PLATFORMS"] = "cpu"
    return env


# ---- 1. kernel tests -------------------------------------------------------------------------------------


def parse_junit(xml: Path) -> dict[str, dict]:
    """Per test file: passed / failed / skipped counts and, for a file that could not be collected, the error."""
    per_file: dict[str, dict] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        errors = [c for c in case if c.tag in ("failure", "error")]
        if not case.get("classname") and errors and errors[0].get("message") == "collection failure":
            mod = case.get("name", "?").split(".")[-1] + ".py"
            lines = [ln[1:].strip() for ln in (errors[0].text or "").splitlines() if ln.startswith("E ")]
            per_file.setdefault(mod, {"passed": 0, "failed": 0, "skipped": 0})["collection"] = \
                (lines[-1] if lines else errors[0].get("message"))[:300]
            continue
        mod = case.get("classname", "?").split(".")[-1] + ".py"
        counts = per_file.setdefault(mod, {"passed": 0, "failed": 0, "skipped": 0})
        kind = {c.tag for c in case}
        if errors:
            counts["failed"] += 1
        elif "skipped" in kind:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return per_file


def run_kernel_tests(rep: Report, sizes: Sizes, gpu: bool, timeout_s: float, files: list[str] | None = None) -> None:
    """``pytest tests/test_kernel_*.py`` (or ``files``) in one process: a file that cannot be collected (a missing
    import) is one error row and the other files still run (``--continue-on-collection-errors``)."""
    files = files if files is not None else sorted(glob.glob(str(ROOT / "tests" / "test_kernel_*.py")))
    if not files:
        rep.add("kernel_tests", "files", 0, "files", "no tests/test_kernel_*.py found", status="error")
        return
    env = child_env(gpu)
    env.update(SCALERL_PALLAS_INTERPRET="0" if gpu else "1", JAX_DEFAULT_MATMUL_PRECISION="highest")
    # tests/conftest.py defaults JAX_PLATFORMS to cpu: name the GPU platform explicitly
    env["JAX_PLATFORMS"] = (os.environ.get("JAX_PLATFORMS") or "cuda") if gpu else "cpu"
    with tempfile.TemporaryDirectory() as d:
        xml = Path(d) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
               f"--junitxml={xml}", *files]
        if sizes.kernel_tests_k:
            cmd += ["-k", sizes.kernel_tests_k]
        res = run_child(cmd, env, timeout_s, capture_stdout=True)
        if res.returncode != 0:
            show_tail("pytest", res.stdout_tail + res.stderr_tail)
        if res.returncode is None:
            rep.add("kernel_tests", "pytest", None, detail=f"timeout: killed after {res.wall_s:.0f} s", status="error")
            return
        if not xml.exists():
            rep.add("kernel_tests", "pytest", res.returncode, "exit code",
                    tail_line(res.stdout_tail) + " " + tail_line(res.stderr_tail), status="error")
            return
        per_file = parse_junit(xml)
    mode = "compiled (SCALERL_PALLAS_INTERPRET=0)" if gpu else "interpret (SCALERL_PALLAS_INTERPRET=1)"
    for mod, c in sorted(per_file.items()):
        if "collection" in c:
            rep.add("kernel_tests", mod, 0, "passed", f"collection error: {c['collection']}", status="error")
            continue
        bad = c["failed"] > 0 or c["passed"] == 0
        rep.add("kernel_tests", mod, c["passed"], "passed", f"{c['failed']} failed, {c['skipped']} skipped; {mode}",
                status="error" if bad else "ok")
    if res.returncode != 0 and not any(r["status"] == "error" for r in rep.rows if r["section"] == "kernel_tests"):
        rep.add("kernel_tests", "pytest", res.returncode, "exit code", tail_line(res.stdout_tail), status="error")
    rep.add("kernel_tests", "wall", res.wall_s, "s", f"{len(files)} files")


# ---- 2-5. the other sections, each in a child process ------------------------------------------------------


def run_section(rep: Report, section: str, arg: str | None, sizes: Sizes, gpu: bool, timeout_s: float,
                remat: bool, module: str = "scalerl_jax.benchmarks.gpu_check") -> None:
    """``python -m benchmarks.gpu_check --section ...`` (``module``: what implements that command line): merge the
    rows and metadata it wrote, and add one error row if it timed out or died without reporting its error."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "section.json"
        cmd = [sys.executable, "-m", module, "--section", section, "--section-out", str(out),
               "--sizes-json", json.dumps(dataclasses.asdict(sizes)), "--section-timeout-s", f"{timeout_s:.1f}"]
        cmd += [] if gpu else ["--cpu-smoke"]
        cmd += ["--section-arg", arg] if arg else []
        cmd += ["--remat"] if remat else []
        if rep.meta.get("peak_flops"):
            cmd += ["--peak-flops", repr(rep.meta["peak_flops"])]
        got = {"rows": [], "meta": {}}
        try:
            res = run_child(cmd, child_env(gpu), timeout_s, capture_stdout=False)
            if res.returncode != 0:
                show_tail(f"section {section}", res.stderr_tail)
        finally:  # also when stopped from outside: keep the rows the section finished
            if out.exists():
                got = json.loads(out.read_text())
            rep.rows.extend(got["rows"])
            rep.meta.update(got["meta"])
    name = f"{section} {arg}" if arg else section
    if res.returncode is None:
        rep.add(section, name, None, detail=f"timeout: killed after {res.wall_s:.0f} s "
                f"(limit {timeout_s:.0f} s)", status="error")
    elif res.returncode != 0 and not any(r["status"] == "error" for r in got["rows"]):
        rep.add(section, name, res.returncode, "exit code", tail_line(res.stderr_tail), status="error")


# ---- the plan -------------------------------------------------------------------------------------------


def _on_signal(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def run_check(sizes: Sizes, gpu: bool, budget_s: float, remat: bool, out: Path, *, min_s: dict | None = None,
              max_s: dict | None = None, section_module: str = "scalerl_jax.benchmarks.gpu_check",
              kernel_test_files: list[str] | None = None) -> Report:
    """Every section in order, each in its own process; ``out`` rewritten after each one. ``min_s`` / ``max_s``
    (default ``SECTION_MIN_S`` / ``SECTION_MAX_S``), ``section_module`` and ``kernel_test_files`` replace what the
    GPU check uses (the driver's tests run it on stand-in sections)."""
    min_s, max_s = min_s or SECTION_MIN_S, max_s or SECTION_MAX_S
    rep = Report(sink=out)
    t_end = time.perf_counter() + budget_s
    rep.meta.update(mode="gpu" if gpu else "cpu-smoke", sizes=dataclasses.asdict(sizes), budget_s=budget_s,
                    python=sys.version.split()[0], finished=False)
    plan: list[tuple[str, str | None]] = [("kernel_tests", None), ("device", None), ("train", None)]
    plan += [("decode", m) for m in sizes.decode_models] + [("impl", None)]
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    rep.write()
    try:
        for i, (section, arg) in enumerate(plan):
            name = f"{section} {arg}" if arg else section
            print(f"== {name}", flush=True)
            left = t_end - time.perf_counter()
            reserve = sum(min_s[s] for s, _ in plan[i + 1:])
            if left < min_s[section]:
                rep.add(section, name, None, detail=f"skipped: {left:.0f} s left of the budget", status="skipped")
                rep.meta.setdefault("section_wall_s", {})[name] = 0.0
                rep.write()
                continue
            timeout = min(max_s[section], max(min_s[section], left - reserve))
            t0 = time.perf_counter()
            try:
                if section == "kernel_tests":
                    run_kernel_tests(rep, sizes, gpu, timeout, kernel_test_files)
                else:
                    run_section(rep, section, arg, sizes, gpu, timeout, remat, section_module)
            except Stopped as e:
                rep.add(section, name, None, detail=f"stopped by {e} while running; later sections not run",
                        status="error")
                raise
            except Exception as e:  # noqa: BLE001 - the driver's own failure is a row too; the rest still run
                rep.error(section, section, e)
            finally:
                rep.meta.setdefault("section_wall_s", {})[name] = round(time.perf_counter() - t0, 2)
            rep.write()
            if section == "device" and gpu and rep.meta.get("backend") != "gpu":
                rep.add("device", "backend", None, detail=f"no GPU backend ({rep.meta.get('backend')}); later "
                        "sections not run (use --cpu-smoke on a CPU)", status="error")
                break
        rep.meta["finished"] = True
    except Stopped:
        pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        rep.meta["wall_s"] = budget_s - (t_end - time.perf_counter())
        rep.write()
    return rep
