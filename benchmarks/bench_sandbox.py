"""Code sandbox overhead: programs per second through a CodePool under bubblewrap against the rlimits mode (and, as
a floor, no sandbox at all), for a trivial program and for HumanEval problems, measured in one run.

    python -m benchmarks.bench_sandbox                          # 64 programs per cell, 4 workers
    python -m benchmarks.bench_sandbox --programs 128 --workers 8 --no-none

Each cell runs ``--programs`` jobs through one :class:`~scalerl_jax.rewards.code_pool.CodePool` (after one warm-up
run) and reports wall time, programs/s and CPU milliseconds per program (this process and every sandbox process it
reaped, user + system); every run must pass (the canonical solutions of HumanEval's first problems, cycled). The
ratio column divides each isolation's rate by the rlimits rate of the same workload. The script uses only the
pool's public interface, so the same file measures an older checkout too (run it with that checkout first on
``PYTHONPATH``): that is how the cost of grading outside the program's interpreter was measured.
``--no-cgroups`` measures this checkout without its per-interpreter cgroups (where the host allows them).
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import time


def _cpu_s() -> float:
    """User + system CPU seconds of this process and of every child it has reaped."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _measure(pool, jobs) -> tuple[float, float, float]:
    pool.map(jobs[:1])  # warm-up: interpreter pages, probe cache, first uid
    t0, c0 = time.perf_counter(), _cpu_s()
    results = pool.map(jobs)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    bad = [r for r in results if not r.passed]
    if bad:
        raise SystemExit(f"{len(bad)} of {len(jobs)} runs did not pass under {pool.isolation}: {bad[0]}")
    return wall, len(jobs) / wall, cpu / len(jobs) * 1000


def main() -> None:
    """Measure every cell and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=64, help="runs per cell")
    ap.add_argument("--workers", type=int, default=4, help="CodePool workers")
    ap.add_argument("--humaneval", type=int, default=16, help="how many HumanEval problems to cycle through")
    ap.add_argument("--no-none", action="store_true", help="skip the unsandboxed floor")
    ap.add_argument("--no-cgroups", action="store_true",
                    help="SandboxConfig(cgroups=False): per-process limits only, even where cgroups can be made")
    a = ap.parse_args()
    try:  # the machine, where this checkout has benchmarks.machine (an older one measured through PYTHONPATH may not)
        from scalerl_jax.benchmarks import machine

        print(machine.header(machine.describe(matmul=False)))
    except ImportError:
        print(f"machine: {os.uname().machine}, {os.cpu_count()} CPUs")

    from scalerl_jax.data.code_tasks import load_humaneval
    from scalerl_jax.rewards.code import SandboxConfig
    from scalerl_jax.rewards.code_pool import CodeJob, CodePool
    from scalerl_jax.rewards.sandbox import SandboxError, find_bwrap

    tasks = load_humaneval()[: a.humaneval]
    workloads = {
        "trivial": [CodeJob("x = 1\n", "assert x == 1\n")] * a.programs,
        "humaneval": [CodeJob(t.reference_program(), t.tests, t.entry_point)
                      for t in itertools.islice(itertools.cycle(tasks), a.programs)],
    }
    modes = ["bwrap", "rlimits"] + ([] if a.no_none else ["none"])
    rows, rate = [], {}
    for mode in modes:
        try:
            extra = {"cgroups": False} if a.no_cgroups else {}
            pool = CodePool(SandboxConfig(isolation=mode, workers=a.workers, timeout_s=30.0, cpu_s=30.0, **extra))
        except SandboxError as e:
            rows.append((mode, "-", "-", "-", "-", f"unavailable: {e}"))
            continue
        with pool:
            for name, jobs in workloads.items():
                wall, per_s, cpu_ms = _measure(pool, jobs)
                rate[mode, name] = per_s
                rows.append((mode, name, f"{wall:.2f}", f"{per_s:.1f}", f"{cpu_ms:.0f}", pool.sandbox.describe()))

    print(f"\ncode sandbox throughput: {a.programs} programs per cell, {a.workers} workers, {os.cpu_count()} CPUs, "
          f"euid {os.geteuid()}, bwrap {find_bwrap()}, load average {os.getloadavg()[0]:.1f}\n")
    print("| isolation | workload | wall s | programs/s | CPU ms/program | vs rlimits | sandbox |")
    print("|---|---|---|---|---|---|---|")
    for mode, name, wall, per_s, cpu_ms, what in rows:
        ref = rate.get(("rlimits", name))
        ratio = f"{rate[mode, name] / ref:.2f}" if ref and (mode, name) in rate else "-"
        print(f"| {mode} | {name} | {wall} | {per_s} | {cpu_ms} | {ratio} | {what} |")


if __name__ == "__main__":
    main()
