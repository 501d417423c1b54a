"""The GPU check's driver (benchmarks/gpu_check_driver.py) on stand-in sections that take no JAX time: a kernel
test file that cannot be collected is one error row while the other files still run; a section that hangs is
killed at its timeout together with the processes it started; a section that crashes keeps the rows it wrote; the
JSON on disk holds every finished section before the next one starts; SIGTERM kills the running section and leaves
the finished ones on disk; a section that no longer fits the budget is skipped. The slow test rebuilds the GPU
machines' offline Python image (benchmarks/offline_image_venv.sh) and runs the CPU smoke check inside it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scalerl_jax.benchmarks import gpu_check
from scalerl_jax.benchmarks.gpu_check_driver import SECTION_MIN_S, run_check

from tests.conftest import HANG_S, ROOT

# what the driver would start as `python -m benchmarks.gpu_check --section ...`, without JAX
FAKE_SECTIONS = '''
import argparse, json, os, subprocess, sys, time
from pathlib import Path
from scalerl_jax.benchmarks.gpu_check_report import Report

ap = argparse.ArgumentParser()
ap.add_argument("--section")
ap.add_argument("--section-out")
ap.add_argument("--section-arg")
args, _ = ap.parse_known_args()
d = Path(os.environ["FAKE_DIR"])
rep = Report(sink=Path(args.section_out), write_every_row=True)
if args.section == "device":
    rep.meta.update(backend="cpu", peak_flops=1e12)
    rep.add("device", "peak assumed for MFU", 1.0, "TFLOP/s")
elif args.section == "train":  # hangs, with a grandchild of its own
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (d / "grandchild.pid").write_text(str(child.pid))
    (d / "train_started").write_text("")
    time.sleep(120)
elif args.section == "decode":
    rep.add("decode", f"{args.section_arg} tokens/s", 5.0, "tok/s")
    if args.section_arg == "m2":
        os._exit(3)  # a crash after one row
elif args.section == "impl":  # what the driver's JSON held when this section started
    held = sorted({r["section"] for r in json.loads(Path(os.environ["FAKE_OUT"]).read_text())["rows"]})
    rep.add("impl", "sections on disk", len(held), "", " ".join(held))
'''
FAST = {"kernel_tests": 0.5, "device": 0.5, "train": 0.5, "decode": 0.5, "impl": 0.5}
SIZES = dataclasses.replace(gpu_check.SMOKE, decode_models=("m1", "m2"), kernel_tests_k=None)


def _gone(pid: int) -> bool:
    """Dead, or a zombie waiting for a parent that never reaps it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def fake(tmp_path, monkeypatch):
    (tmp_path / "fake_sections.py").write_text(FAKE_SECTIONS)
    kt = tmp_path / "kt"
    kt.mkdir()
    (kt / "test_kernel_fake_bad.py").write_text("import no_such_module_xyz\n\n\ndef test_a():\n    pass\n")
    (kt / "test_kernel_fake_fail.py").write_text("def test_ok():\n    pass\n\n\ndef test_bad():\n    assert 1 == 2\n")
    (kt / "test_kernel_fake_ok.py").write_text("def test_sum():\n    assert 1 + 1 == 2\n")
    out = tmp_path / "check.json"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    monkeypatch.setenv("FAKE_OUT", str(out))
    return tmp_path, out, sorted(str(p) for p in kt.iterdir())


def test_sections_fail_alone_and_the_json_keeps_each_finished_one(fake):
    d, out, files = fake
    max_s = {**{k: 60.0 for k in FAST}, "train": 3.0}
    t0 = time.perf_counter()
    rep = run_check(SIZES, gpu=False, budget_s=300, remat=False, out=out, min_s=FAST, max_s=max_s,
                    section_module="fake_sections", kernel_test_files=files)
    assert time.perf_counter() - t0 < 300  # a hang guard: the sections' limits are a few seconds each
    data = json.loads(out.read_text())
    assert data["rows"] == rep.rows and data["meta"]["finished"] is True
    by = {(r["section"], r["name"]): r for r in data["rows"]}
    # the file that cannot be collected is one error row; the other files ran
    bad = by[("kernel_tests", "test_kernel_fake_bad.py")]
    assert bad["status"] == "error" and "ModuleNotFoundError: No module named 'no_such_module_xyz'" in bad["detail"]
    assert by[("kernel_tests", "test_kernel_fake_fail.py")]["status"] == "error"
    assert by[("kernel_tests", "test_kernel_fake_fail.py")]["detail"].startswith("1 failed")
    assert by[("kernel_tests", "test_kernel_fake_ok.py")]["status"] == "ok"
    assert by[("kernel_tests", "test_kernel_fake_ok.py")]["value"] == 1
    assert by[("device", "peak assumed for MFU")]["status"] == "ok"
    # the hanging section: killed at its 3 s limit, with the process it started
    train = by[("train", "train")]
    assert train["status"] == "error" and "timeout" in train["detail"] and "limit 3 s" in train["detail"]
    # not before its limit; after it, the kill and the reaping (a hang guard's room for a loaded machine)
    assert 2.5 < data["meta"]["section_wall_s"]["train"] < 60
    assert _gone(int((d / "grandchild.pid").read_text()))
    # the crashed section keeps its row and adds one error row; the one after it still ran
    assert by[("decode", "m1 tokens/s")]["status"] == "ok" and by[("decode", "m2 tokens/s")]["status"] == "ok"
    assert by[("decode", "decode m2")]["status"] == "error" and by[("decode", "decode m2")]["value"] == 3
    # when the last section started, the JSON on disk already held every earlier section
    assert by[("impl", "sections on disk")]["detail"] == "decode device kernel_tests train"
    assert "decode m2" in rep.summary() and "train" in rep.summary()


def test_sigterm_kills_the_running_section_and_keeps_the_finished_ones(fake):
    d, out, files = fake
    code = (f"from pathlib import Path\nfrom scalerl_jax.benchmarks.gpu_check_driver import run_check\n"
            f"from tests.test_gpu_check_driver import SIZES, FAST\n"
            f"run_check(SIZES, gpu=False, budget_s=300, remat=False, out=Path({str(out)!r}), min_s=FAST,\n"
            f"          max_s={{k: 120.0 for k in FAST}}, section_module='fake_sections', kernel_test_files=[])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(d)])}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600  # a hang guard for the driver's start-up
    while not (d / "train_started").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.1)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    assert time.perf_counter() - t0 < 60  # at once (the running section is killed), with room for a loaded machine
    data = json.loads(out.read_text())
    sections = [r["section"] for r in data["rows"]]
    assert "device" in sections and "decode" not in sections and "impl" not in sections
    stopped = [r for r in data["rows"] if r["section"] == "train"]
    assert len(stopped) == 1 and stopped[0]["status"] == "error" and "stopped by SIGTERM" in stopped[0]["detail"]
    assert data["meta"]["finished"] is False
    assert _gone(int((d / "grandchild.pid").read_text()))


def test_a_section_that_no_longer_fits_the_budget_is_skipped(fake):
    _, out, files = fake
    rep = run_check(SIZES, gpu=False, budget_s=20, remat=False, out=out, min_s={**FAST, "kernel_tests": 30.0,
                    "train": 30.0}, section_module="fake_sections", kernel_test_files=files)
    status = {r["name"]: r["status"] for r in rep.rows}
    assert status["kernel_tests"] == "skipped" and status["train"] == "skipped"
    assert status["peak assumed for MFU"] == "ok" and status["sections on disk"] == "ok"
    assert json.loads(out.read_text())["rows"] == rep.rows
    assert SECTION_MIN_S.keys() == FAST.keys()  # every section has a minimum


@pytest.mark.heavy
@pytest.mark.slow
def test_cpu_smoke_in_the_offline_image_venv(tmp_path):
    """benchmarks/offline_image_venv.sh: a Python 3.12 venv with only the GPU image's packages (built once, then
    reused from .venv-offline/) runs every section of the CPU smoke check; nothing fails on a missing package."""
    venv = ROOT / ".venv-offline"
    if not (venv / ".offline-image-stamp").exists():
        probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "jax"], capture_output=True,
                               text=True, timeout=HANG_S)
        if probe.returncode != 0:
            pytest.skip("the package index is unreachable ('pip index versions jax' failed) and no offline-image "
                        f"venv is cached in {venv}: cannot build it")
    out = tmp_path / "offline.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "JAX_PLATFORMS")}
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "offline_image_venv.sh"), "--out", str(out)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, (r.stdout[-4000:], r.stderr[-4000:])
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert {r["section"] for r in rows} == {"kernel_tests", "device", "train", "decode", "impl"}
    assert all(r["status"] in ("ok", "unavailable") for r in rows), [r for r in rows if r["status"] != "ok"]
    assert not any("No module named" in r["detail"] for r in rows)
    assert data["meta"]["python"].startswith("3.12.") and data["meta"]["finished"] is True
    major, minor = (int(x) for x in data["meta"]["jax_version"].split(".")[:2])
    assert (major, minor) >= (0, 7)
    assert "== offline image venv: jax " in r.stdout
    # the venv really lacks what the image lacks
    missing = subprocess.run([str(venv / "bin" / "python"), "-c", "import tyro"], capture_output=True, text=True)
    assert missing.returncode != 0 and "No module named 'tyro'" in missing.stderr
