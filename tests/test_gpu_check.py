"""benchmarks/gpu_check.py in its CPU smoke mode: every section runs (kernel tests in interpret mode, device peak,
the RL train step's MFU, engine decode for both model shapes, every ``*_impl`` choice against its reference) and
the JSON holds the table with finite numbers; the MFU and tokens/s rows agree with the recorded step time and
sizes re-derived by hand; the shell entry point refuses to run without a GPU instead of falling back to CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scalerl_jax.benchmarks import gpu_check

from tests.conftest import HANG_S, ROOT
from tests.tolerances import ops

#: the CPU smoke check, run once in the suite's background lane (tests/conftest.py) for the tests marked with it
SMOKE = pytest.mark.background("gpu_check_cpu_smoke", ["-m", "benchmarks.gpu_check", "--cpu-smoke", "--out",
                                                       "{out}/check.json"])


@pytest.fixture
def smoke(background):
    r = background["gpu_check_cpu_smoke"]
    assert r.returncode == 0, (r.stdout[-4000:], r.stderr[-4000:])
    return json.loads(Path(r.args[-1]).read_text()), r.stdout


@pytest.mark.extended
@SMOKE
def test_every_section_reports_finite_numbers(smoke):
    data, stdout = smoke
    rows = data["rows"]
    assert {r["section"] for r in rows} == {"kernel_tests", "device", "train", "decode", "impl"}
    assert all(r["status"] in ("ok", "unavailable") for r in rows), [r for r in rows if r["status"] != "ok"]
    for r in rows:
        assert set(r) == {"section", "name", "value", "unit", "detail", "status"}
        if r["status"] == "ok":
            assert r["value"] is not None and math.isfinite(r["value"]) and r["value"] >= 0, r
    by = {(r["section"], r["name"]): r["value"] for r in rows}
    for key in [("train", "step time"), ("train", "tokens/s"), ("train", "MFU (6N)"),
                ("device", "peak assumed for MFU"), ("decode", "llama3_1b tokens/s"), ("decode", "llama3_8b tokens/s"),
                ("impl", "reference value+grad"), ("impl", "reference at float32 compute: loss rel. diff")]:
        assert by[key] > 0, key  # (bf16 activations move the loss: the yardstick is not zero)
    # the kernel tests ran (interpreted on CPU) and passed; one row per test file found by the glob
    kt = [r for r in rows if r["section"] == "kernel_tests" and r["name"].startswith("test_kernel_")]
    assert len(kt) >= 1 and all(r["value"] >= 1 and r["detail"].startswith("0 failed") for r in kt)
    # every *_impl field with a "reference" choice was compared, each non-reference choice by name
    for field, choices in data["meta"]["impl_fields"].items():
        for c in choices:
            assert any(r["name"].startswith(f"{field}={c}") for r in rows if r["section"] == "impl"), (field, c)
    assert "section" in stdout and "wrote" in stdout  # the printed table


@pytest.mark.extended
@SMOKE
def test_mfu_rederived_from_recorded_sizes(smoke):
    data, _ = smoke
    t, peak = data["meta"]["train"], data["meta"]["peak_flops"]
    sz = data["meta"]["sizes"]
    tokens = sz["train_batch"] * sz["train_seq"]
    assert t["tokens_per_step"] == tokens
    # N by hand for the smoke run's cut-down Llama-3.2-1B (tied embeddings: the head counts once): per layer
    # q, o (H * Dh = 32 each) and k, v (K * Dh = 16 each) projections of d 32, three SwiGLU matrices 32 x 64
    d, h_dh, k_dh, f, v, layers = 32, 4 * 8, 2 * 8, 64, 96, 2
    n = layers * (d * (2 * h_dh + 2 * k_dh) + 3 * d * f) + d * v
    assert t["n_matmul_params"] == n
    by = {(r["section"], r["name"]): r["value"] for r in data["rows"]}
    # the same float64 formulas in another order (tests/tolerances.py)
    assert by[("train", "MFU (6N)")] == pytest.approx(6 * n * tokens / t["step_s"] / peak, rel=2 * ops(4, "float64"))
    assert by[("train", "tokens/s")] == pytest.approx(tokens / t["step_s"], rel=2 * ops(1, "float64"))


def test_impl_fields_found_by_name():
    fields = gpu_check.impl_fields()
    assert fields["attention_impl"] == ("cudnn", "pallas")
    assert fields["head_matmul_impl"] == ("bf16x3", "bf16x6", "bf16")
    assert "moe_impl" not in fields  # no "reference" choice: not a kernel switch


def test_shell_entry_point_refuses_without_gpu():
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_INSTALL_JAX": "0"}
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=HANG_S)
    assert r.returncode == 2 and "jax sees no GPU" in r.stderr, (r.stdout, r.stderr)
