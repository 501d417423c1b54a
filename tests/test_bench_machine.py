"""benchmarks/machine.py: the facts a benchmark records, checked against what the OS reports directly."""

import os
import sys

import pytest
from scalerl_jax.benchmarks import machine


def test_describe_reports_what_the_os_reports():
    facts = machine.describe(matmul=False)
    assert facts["cpus"] == os.cpu_count() and 1 <= facts["cores_usable"] <= facts["cpus"]
    assert set(facts["isa"]) <= set(machine.ISA_FLAGS)
    assert "jax" in facts["versions"] and "matmul_1024_f32_gflops" not in facts
    if sys.platform.startswith("linux"):
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.split(":")[0].strip() in ("flags", "Features")),
                     [])
        assert facts["isa"] == [f for f in machine.ISA_FLAGS if f in flags]
        names = [ln.split(":", 1)[1].strip() for ln in lines if ln.split(":")[0].strip() in ("model name", "Model")]
        if names:
            assert facts["cpu"] == names[0]
        assert facts["cores_usable"] == len(os.sched_getaffinity(0))


def test_header_names_the_cpu_the_rate_and_the_libraries():
    facts = {"cpu": "Some CPU", "arch": "x86_64", "isa": ["avx2", "amx_tile"], "cores_usable": 2, "cpus": 4,
             "memory_gib": 24.0, "load_1min": 0.5, "versions": {"jax": "1.0", "torch": "2.0"},
             "matmul_1024_f32_gflops": 123.4}
    line = machine.header(facts)
    for part in ("Some CPU", "avx2 amx_tile", "2 of 4 cores", "24 GiB", "123 GFLOP/s", "load 0.5", "jax 1.0",
                 "torch 2.0"):
        assert part in line


@pytest.mark.parametrize("n", [64])
def test_the_matmul_rate_is_a_rate(n):
    # 2 n^3 FLOPs in a positive, finite time
    assert 0 < machine.matmul_flops_per_s(n, reps=2) < float("inf")
