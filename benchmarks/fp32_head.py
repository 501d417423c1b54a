"""How precise each way of computing the FP32 LM head is: log-probs and entropies against float64, at real shapes.

    .venv/bin/python -m benchmarks.fp32_head                         # Llama-3.2-1B's head: D 2048, V 128256
    .venv/bin/python -m benchmarks.fp32_head --tokens 32 --d 4096    # Llama-3.1-8B's width

For each ``ModelConfig.head_matmul_impl`` (``scalerl_jax/models/head_matmul.py``: ``reference`` = IEEE float32 at
``Precision.HIGHEST``; ``bf16x6``, ``bf16x3`` = float32 sums of 6 / 3 exact bf16 products; ``bf16`` = bf16 inputs,
float32 accumulation) this runs the project's own ``token_logprobs`` (chunked, as the train step calls it) on the
same float32 hidden states and head, and compares with float64 (NumPy) on the same float32 inputs:

* ``|dlogp|`` max and mean, ``|dH|`` max (entropy): the option's own error;
* ``bound``: what independent roundings allow, ``2 x 6 (u + sqrt(D) eps32) max_t,v ||h_t * w_v||_2``, with ``u``
  the per-product error of the option's bf16 terms, with bf16's unit roundoff 2^-8 (8 significant bits): bf16x3
  3 x 2^-16 (the dropped lo.lo product and the two splits' residuals); bf16x6 4 x 2^-24 (the two residuals and the
  dropped products of terms 1.2 and 2.1); bf16 2 x 2^-8 + 2^-16 (both inputs rounded); reference 0. ``eps32`` =
  2^-24 per float32 addition: a logit's error is a sum of D independent roundings, each at most
  ``(u + eps32) |h_d w_d|`` (six standard deviations of that sum, with the accumulation's sqrt(D) growth), a
  log-prob's at most twice a logit's (the target's logit and the log-sum-exp);
* the train/generator mismatch of the FP32 head: the generator holds the head in bf16 (``rollout.weight_dtype``);
  ``gen |dlogp|`` is the mean |logp(trainer) - logp(generator)| with both sides on the option, and ``err / gen``
  the option's own mean error over the *reference's* mismatch. An option keeps the importance ratio where the
  IEEE float32 head puts it when its own error is at most 1 % of that mismatch (``err / gen`` <= 0.01). (The
  ``bf16`` option's mismatch is 0 here only because both sides round the same head to bf16: its log-probs are
  still that far from the float32 model's, and a real generator's hidden states differ from the trainer's.)

The inputs stand in for a trained model's: final-norm hidden states (unit RMS, a few outlier channels 8x wider,
each token's scale drawn from [0.5, 2] so the logits range from flat to peaked), a head of N(0, sigma) entries with
sigma set for a logit standard deviation of ``--logit-std`` at unit scale, and targets sampled from the float64
softmax (what a policy's own samples look like). On a CPU each option computes with float32 arithmetic on its bf16
terms: a GPU's tensor cores give the same products, in a different accumulation order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

#: per-product relative error of each option's bf16 terms (see the module docstring)
PRODUCT_ERROR = {"reference": 0.0, "bf16x6": 4 * 2.0**-24, "bf16x3": 3 * 2.0**-16, "bf16": 2 * 2.0**-8 + 2.0**-16}
EPS32 = 2.0**-24
SIGMAS = 6.0
MISMATCH_SHARE = 0.01  # an option's own error may be at most this share of the reference's train/gen mismatch


def make_inputs(n: int, d: int, v: int, logit_std: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((n, d))
    h[:, rng.choice(d, max(1, d // 256), replace=False)] *= 8.0  # outlier channels
    h /= np.sqrt(np.mean(h**2, axis=1, keepdims=True))  # RMS norm
    h *= rng.uniform(0.5, 2.0, size=(n, 1))  # flat to peaked
    w = rng.standard_normal((d, v)) * (logit_std / np.sqrt(d))
    h32, w32 = h.astype(np.float32), w.astype(np.float32)
    z = h32.astype(np.float64) @ w32.astype(np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    targets = np.array([rng.choice(v, p=row) for row in p], np.int32)
    return h32, w32, targets


def float64_logp_entropy(h32: np.ndarray, w: np.ndarray, targets: np.ndarray, chunk: int = 16):
    """Float64 log-probs and entropies of float32 (or bf16-valued) inputs, ``chunk`` tokens at a time."""
    logp, ent = np.empty(len(h32)), np.empty(len(h32))
    w64 = w.astype(np.float64)
    for s in range(0, len(h32), chunk):
        z = h32[s:s + chunk].astype(np.float64) @ w64
        m = z.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
        p = np.exp(z - lse[:, None])
        logp[s:s + chunk] = z[np.arange(len(z)), targets[s:s + chunk]] - lse
        ent[s:s + chunk] = lse - (p * z).sum(axis=1)
    return logp, ent


def l2_product_max(h32: np.ndarray, w32: np.ndarray, chunk: int = 16) -> float:
    """max over tokens t and vocabulary v of ||h_t * w_v||_2 = sqrt(sum_d h_td^2 w_dv^2) (float64)."""
    w2 = w32.astype(np.float64) ** 2
    return max(float(np.sqrt((h32[s:s + chunk].astype(np.float64) ** 2 @ w2).max())) for s in range(0, len(h32), chunk))


def bound(impl: str, d: int, l2: float) -> float:
    """The log-prob error independent roundings allow (module docstring)."""
    return 2.0 * SIGMAS * (PRODUCT_ERROR[impl] + np.sqrt(d) * EPS32) * l2


def project_logp_entropy(h32, w, targets, impl: str, chunk: int = 16):
    """The project's chunked ``token_logprobs`` (float32 head, ``head_matmul_impl=impl``)."""
    import jax.numpy as jnp

    from scalerl_jax.losses.logprobs import token_logprobs

    lp, ent = token_logprobs(jnp.asarray(h32)[None], jnp.asarray(w), jnp.asarray(targets)[None], chunk=chunk,
                             head_matmul_impl=impl)
    return np.asarray(lp[0], np.float64), np.asarray(ent[0], np.float64)


def study(n: int, d: int, v: int, logit_std: float, seed: int = 0, chunk: int = 16) -> dict:
    import ml_dtypes

    h32, w32, targets = make_inputs(n, d, v, logit_std, seed)
    w_gen = w32.astype(ml_dtypes.bfloat16).astype(np.float32)  # the generator's bf16 copy of the head
    ref_lp, ref_ent = float64_logp_entropy(h32, w32, targets, chunk)
    l2 = l2_product_max(h32, w32, chunk)
    rows = {}
    for impl in PRODUCT_ERROR:
        t0 = time.perf_counter()
        lp, ent = project_logp_entropy(h32, w32, targets, impl, chunk)
        glp, _ = project_logp_entropy(h32, w_gen, targets, impl, chunk)
        rows[impl] = {"logp_err_max": float(np.abs(lp - ref_lp).max()),
                      "logp_err_mean": float(np.abs(lp - ref_lp).mean()),
                      "entropy_err_max": float(np.abs(ent - ref_ent).max()),
                      "bound": bound(impl, d, l2),
                      "gen_mismatch_mean": float(np.abs(lp - glp).mean()),
                      "cpu_seconds": time.perf_counter() - t0}
    for r in rows.values():
        r["err_over_ref_mismatch"] = r["logp_err_mean"] / rows["reference"]["gen_mismatch_mean"]
    return {"tokens": n, "d": d, "vocab": v, "logit_std": logit_std, "seed": seed, "l2_product_max": l2,
            "entropy_mean": float(ref_ent.mean()), "logp_mean": float(ref_lp.mean()), "options": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--d", type=int, default=2048, help="model width (Llama-3.2-1B: 2048; 8B: 4096)")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--logit-std", type=float, default=3.0, help="logit standard deviation at unit hidden scale")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the numbers to this file")
    a = ap.parse_args(argv)
    from scalerl_jax.benchmarks import machine

    print(machine.header(machine.describe(matmul=False)))
    r = study(a.tokens, a.d, a.vocab, a.logit_std, a.seed)
    print(f"{a.tokens} tokens, D {a.d}, V {a.vocab}; mean entropy {r['entropy_mean']:.2f} nats, mean log-prob "
          f"{r['logp_mean']:.2f}; max_t,v ||h * w||_2 = {r['l2_product_max']:.2f}")
    print("head_matmul_impl | max abs dlogp | mean abs dlogp | max abs dH | bound | gen mean abs dlogp | err / gen")
    print("--- | --- | --- | --- | --- | --- | ---")
    for impl, o in r["options"].items():
        print(f"{impl} | {o['logp_err_max']:.2e} | {o['logp_err_mean']:.2e} | {o['entropy_err_max']:.2e} | "
              f"{o['bound']:.2e} | {o['gen_mismatch_mean']:.3e} | {o['err_over_ref_mismatch']:.4f}")
    ok = [i for i, o in r["options"].items() if o["err_over_ref_mismatch"] <= MISMATCH_SHARE]
    print(f"options whose own error is at most {MISMATCH_SHARE:.0%} of the FP32 head's train/generator mismatch: "
          f"{', '.join(ok)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
