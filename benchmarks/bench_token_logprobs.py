"""Compiled peak scratch memory of the fused token log-prob kernel against the chunked and naive references.

    .venv/bin/python -m benchmarks.bench_token_logprobs                    # N = 2 x 2048 tokens, D 4096, V 128256
    .venv/bin/python -m benchmarks.bench_token_logprobs --D 256 --T 1024   # quicker

For each implementation the forward and ``value_and_grad`` (w.r.t. hidden and head weight) are compiled ahead of
time for abstract inputs (nothing is allocated or run) and XLA's ``memory_analysis()`` is read: ``temp`` is the
scratch the program needs beyond its arguments and outputs. Ratios are against the naive [B, T, V] computation
compiled in the same run.

- naive: ``scalerl_jax.losses.token_logprobs_naive`` (full float32 logits);
- chunked: ``scalerl_jax.losses.token_logprobs`` (``--chunk`` positions per block under lax.map + checkpoint);
- kernel: ``scalerl_jax.kernels.token_logprobs.token_logprobs`` with ``interpret=None``: on CPU that is the Pallas
  *interpreter*, whose program is the kernel body lowered to XLA loops over the grid (its memory is what the
  interpreter needs, not what the compiled GPU kernel needs); on a GPU the same command compiles the Triton
  kernel, whose scratch XLA reports as the pallas_call's outputs and residuals only.
"""

from __future__ import annotations

import argparse

MiB = 2**20


def _build(impl: str, mode: str, chunk: int):
    import jax
    import jax.numpy as jnp

    from scalerl_jax.kernels.token_logprobs import token_logprobs as kernel
    from scalerl_jax.losses import token_logprobs, token_logprobs_naive

    fns = {
        "naive": token_logprobs_naive,
        "chunked": lambda h, w, t: token_logprobs(h, w, t, chunk=chunk),
        "kernel": lambda h, w, t: kernel(h, w, t),
    }
    fn = fns[impl]
    if mode == "fwd":
        return jax.jit(fn)

    def objective(h, w, t):
        logp, ent = fn(h, w, t)
        return jnp.sum(logp) + 0.01 * jnp.sum(ent)

    return jax.jit(jax.value_and_grad(objective, argnums=(0, 1)))


def compiled_memory(impl: str, mode: str, B: int, T: int, D: int, V: int, chunk: int, dtype: str) -> dict[str, int]:
    """``memory_analysis()`` byte counts of one implementation's compiled forward (``fwd``) or value-and-grad."""
    import jax
    import jax.numpy as jnp

    args = (
        jax.ShapeDtypeStruct((B, T, D), jnp.dtype(dtype)),
        jax.ShapeDtypeStruct((D, V), jnp.float32),
        jax.ShapeDtypeStruct((B, T), jnp.int32),
    )
    ma = _build(impl, mode, chunk).lower(*args).compile().memory_analysis()
    return {"temp": ma.temp_size_in_bytes, "args": ma.argument_size_in_bytes, "out": ma.output_size_in_bytes}


def main(argv: list[str] | None = None) -> None:
    """Compile every implementation, print the table of scratch memory and ratios against naive."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--D", type=int, default=4096)
    ap.add_argument("--V", type=int, default=128256)
    ap.add_argument("--chunk", type=int, default=256, help="positions per block of the chunked reference")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="hidden-state dtype")
    a = ap.parse_args(argv)
    import jax

    N, logits = a.B * a.T, a.B * a.T * a.V * 4
    print(f"backend {jax.default_backend()}; N = B*T = {a.B}x{a.T} = {N} tokens, D {a.D}, V {a.V}, hidden "
          f"{a.dtype}, head float32; full float32 logits = {logits / MiB:,.0f} MiB; chunk {a.chunk}")
    rows = {}
    for impl in ("naive", "chunked", "kernel"):
        rows[impl] = {mode: compiled_memory(impl, mode, a.B, a.T, a.D, a.V, a.chunk, a.dtype)
                      for mode in ("fwd", "grad")}
    base = rows["naive"]
    print(f"\n{'impl':<8} {'fwd temp MiB':>13} {'vs naive':>9} {'fwd+bwd temp MiB':>17} {'vs naive':>9} "
          f"{'args MiB':>9}")
    for impl, r in rows.items():
        f, g = r["fwd"]["temp"], r["grad"]["temp"]
        print(f"{impl:<8} {f / MiB:>13,.1f} {f / max(base['fwd']['temp'], 1):>9.4f} {g / MiB:>17,.1f} "
              f"{g / max(base['grad']['temp'], 1):>9.4f} {r['grad']['args'] / MiB:>9,.1f}")
    # every fwd+bwd program holds one float32 head-weight-sized buffer while dW is accumulated (in interpret mode
    # the kernel's dW output block is carried through the grid loop and copied out); the rest is what differs
    print(f"\none float32 head weight (the dW accumulator) = {a.D * a.V * 4 / MiB:,.1f} MiB")


if __name__ == "__main__":
    main()
