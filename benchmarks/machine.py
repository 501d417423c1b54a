"""The machine a benchmark ran on, recorded beside its numbers: CPUs differ between machines, and a speed ratio
means little without the CPU it was measured on.

    .venv/bin/python -m benchmarks.machine            # prints the facts as JSON (the matmul rate takes ~5 s)

``describe()`` returns: the CPU model (``/proc/cpuinfo``'s ``model name``, else ``platform.processor()`` /
``sysctl machdep.cpu.brand_string`` on macOS), the instruction-set extensions that decide XLA's and oneDNN's CPU
kernels (AVX2, AVX-512 F / BF16 / FP16, AMX, Arm NEON / SVE, as the kernel reports them), the cores this process
may use (its affinity mask) and the machine's logical CPUs, memory, the 1-minute load average at the time (another
job beside a benchmark shows there), the versions of the libraries that do the work, and the best float32 rate of a
jitted 1024^3 matmul in this process (best of 20). ``header(facts)`` is the one line a benchmark prints first.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time

#: the ISA flags worth naming (Linux /proc/cpuinfo spelling)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16",
             "amx_int8", "asimd", "sve", "sve2")
LIBRARIES = ("jax", "jaxlib", "optax", "numpy", "torch", "transformers", "trl", "tunix")


def _cpuinfo() -> tuple[str, list[str]]:
    model, flags = "", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.split()
    except OSError:
        pass
    if not model and sys.platform == "darwin":
        try:
            model = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return model or platform.processor() or platform.machine(), flags


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def matmul_flops_per_s(n: int = 1024, reps: int = 20) -> float:
    """This process's float32 matmul rate (FLOP/s): the best of ``reps`` timed n x n x n products, compiled first."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def describe(matmul: bool = True) -> dict:
    model, flags = _cpuinfo()
    have = set(flags)
    versions = {}
    for lib in LIBRARIES:
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        usable = os.cpu_count()
    facts = {
        "cpu": model, "arch": platform.machine(), "isa": [f for f in ISA_FLAGS if f in have],
        "cores_usable": usable, "cpus": os.cpu_count(), "memory_gib": _memory_gib(),
        "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "os": platform.platform(), "python": platform.python_version(), "versions": versions,
    }
    if matmul:
        facts["matmul_1024_f32_gflops"] = matmul_flops_per_s() / 1e9
    return facts


def header(facts: dict) -> str:
    """One line: CPU, ISA, cores, matmul rate, load, the main libraries."""
    mem = f", {facts['memory_gib']:.0f} GiB" if facts.get("memory_gib") else ""
    rate = (f"; 1024^3 f32 matmul {facts['matmul_1024_f32_gflops']:.0f} GFLOP/s"
            if "matmul_1024_f32_gflops" in facts else "")
    load = f"; load {facts['load_1min']:.1f}" if facts.get("load_1min") is not None else ""
    libs = " ".join(f"{k} {v}" for k, v in facts["versions"].items())
    return (f"machine: {facts['cpu']} ({facts['arch']}; {' '.join(facts['isa']) or 'no listed ISA extensions'}), "
            f"{facts['cores_usable']} of {facts['cpus']} cores{mem}{rate}{load}; {libs}")


if __name__ == "__main__":
    print(json.dumps(describe(), indent=2))
