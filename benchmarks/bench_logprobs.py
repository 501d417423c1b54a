"""Peak memory and time of chunked FP32 token log-probs against the naive [B, T, V] computation.

    .venv/bin/python -m benchmarks.bench_logprobs                       # B=4 T=8192 V=128256 D=64, chunk 256
    .venv/bin/python -m benchmarks.bench_logprobs --run-T 512 --no-run-full   # quicker

Two measurements, printed as tables:

1. Compiled memory at the full size (ahead of time, nothing allocated): XLA's ``memory_analysis()`` of the
   forward and of ``value_and_grad`` (w.r.t. hidden and head) for both implementations; ``temp`` is the scratch
   the program needs beyond its arguments and outputs. The naive forward alone holds 16 GiB of float32 logits
   at the full size, so it is only compiled there, not run.
2. Measured runs, each in a fresh subprocess: wall time (median of ``--repeats`` after one warm-up call) and
   the process's peak resident memory (``ru_maxrss``) minus its value just before the first call (inputs
   allocated and the program compiled), i.e. the peak extra host memory of executing it. Both
   implementations run at ``--run-T``; the chunked one also runs at the full T unless ``--no-run-full``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

MiB = 2**20


def _build(impl: str, mode: str, chunk: int):
    import jax
    import jax.numpy as jnp

    from scalerl_jax.losses import token_logprobs, token_logprobs_naive

    if impl == "chunked":

        def fn(h, w, t):
            return token_logprobs(h, w, t, chunk=chunk)
    else:
        fn = token_logprobs_naive

    def objective(h, w, t):
        logp, ent = fn(h, w, t)
        return jnp.sum(logp) + 0.01 * jnp.sum(ent)

    if mode == "fwd":
        return jax.jit(fn)
    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1)))


def compiled_memory(impl: str, mode: str, B: int, T: int, V: int, D: int, chunk: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    args = (
        jax.ShapeDtypeStruct((B, T, D), jnp.float32),
        jax.ShapeDtypeStruct((D, V), jnp.float32),
        jax.ShapeDtypeStruct((B, T), jnp.int32),
    )
    ma = _build(impl, mode, chunk).lower(*args).compile().memory_analysis()
    return {"temp": ma.temp_size_in_bytes, "args": ma.argument_size_in_bytes, "out": ma.output_size_in_bytes}


def worker(impl: str, mode: str, B: int, T: int, V: int, D: int, chunk: int, repeats: int) -> dict[str, float]:
    """Run one configuration in this process and report time and peak RSS growth (ru_maxrss is in KiB)."""
    import jax

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    h = jax.random.normal(k1, (B, T, D))
    w = jax.random.normal(k2, (D, V)) * 0.1
    t = jax.random.randint(k3, (B, T), 0, V)
    f = _build(impl, mode, chunk).lower(h, w, t).compile()
    jax.block_until_ready((h, w, t))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    jax.block_until_ready(f(h, w, t))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(h, w, t))
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"time_s": statistics.median(times), "peak_extra": max(peak - base, 0), "peak_rss": peak}


def run_subprocess(impl, mode, B, T, V, D, chunk, repeats) -> dict[str, float]:
    cmd = [sys.executable, "-m", "scalerl_jax.benchmarks.bench_logprobs", "--worker", impl, mode]
    cmd += ["--B", str(B), "--T", str(T), "--V", str(V), "--D", str(D), "--chunk", str(chunk)]
    cmd += ["--repeats", str(repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--T", type=int, default=8192)
    p.add_argument("--V", type=int, default=128256)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--run-T", type=int, default=1024, help="T at which both implementations are actually run")
    p.add_argument("--no-run-full", action="store_true", help="skip running the chunked one at the full T")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--worker", nargs=2, metavar=("IMPL", "MODE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        print(json.dumps(worker(*a.worker, a.B, a.T, a.V, a.D, a.chunk, a.repeats)))
        return

    B, T, V, D, c = a.B, a.T, a.V, a.D, a.chunk
    print(
        f"B={B} T={T} V={V} D={D} chunk={c}; one float32 [B,T,V] logits tensor = {B * T * V * 4 / MiB:,.0f} MiB, "
        f"one [B,chunk,V] block = {B * c * V * 4 / MiB:,.0f} MiB\n"
    )
    print(f"1. Compiled memory analysis at T={T} (MiB)")
    print(f"{'mode':<16}{'naive temp':>14}{'chunked temp':>14}{'ratio':>9}{'args':>9}{'out':>9}")
    for mode, label in (("fwd", "forward"), ("grad", "value_and_grad")):
        n = compiled_memory("naive", mode, B, T, V, D, c)
        ch = compiled_memory("chunked", mode, B, T, V, D, c)
        ratio = n["temp"] / max(ch["temp"], 1)
        print(
            f"{label:<16}{n['temp'] / MiB:>14,.1f}{ch['temp'] / MiB:>14,.1f}{ratio:>8.1f}x"
            f"{ch['args'] / MiB:>9.1f}{ch['out'] / MiB:>9.1f}"
        )

    runs = [(T_, impl, mode) for T_ in (a.run_T,) for mode in ("fwd", "grad") for impl in ("naive", "chunked")]
    if not a.no_run_full and T != a.run_T:
        runs += [(T, "chunked", "fwd"), (T, "chunked", "grad")]
    print("\n2. Measured runs, one subprocess each (peak extra RSS = ru_maxrss growth while executing)")
    print(f"{'T':>6} {'impl':<9}{'mode':<16}{'time s':>9}{'peak extra MiB':>16}{'peak RSS MiB':>14}")
    results = {}
    for T_, impl, mode in runs:
        r = run_subprocess(impl, mode, B, T_, V, D, c, a.repeats)
        results[T_, impl, mode] = r
        label = "forward" if mode == "fwd" else "value_and_grad"
        print(
            f"{T_:>6} {impl:<9}{label:<16}{r['time_s']:>9.2f}{r['peak_extra'] / MiB:>16,.0f}"
            f"{r['peak_rss'] / MiB:>14,.0f}",
            flush=True,
        )
    print(f"\nratios at T={a.run_T} (naive / chunked)")
    for mode in ("fwd", "grad"):
        n, ch = results[a.run_T, "naive", mode], results[a.run_T, "chunked", mode]
        print(
            f"  {mode:<5} time {n['time_s'] / ch['time_s']:.2f}x   peak extra memory "
            f"{n['peak_extra'] / max(ch['peak_extra'], 1):.1f}x"
        )


if __name__ == "__main__":
    main()
