"""Size of the importance-ratio error a bfloat16 LM head causes, against the FP32 head (ScaleRL's FP32-logits fix).

    .venv/bin/python -m benchmarks.bench_bf16_head                              # tiny (random) + llama_100m shapes
    .venv/bin/python -m benchmarks.bench_bf16_head --tiny-ckpt RUN_DIR/warmstart  # tiny from a warm-start checkpoint

Generator and trainer share the same weights and differ *only* in LM-head precision. The generator is the
embedded :class:`JaxEngine` built with ``ModelConfig.head_dtype`` = "float32" or "bfloat16" (it records each sampled
token's log-prob with that head, temperature 1). The trainer recomputes the log-probs of the same sequences with
:func:`forward_hidden` + :func:`token_logprobs` (``head_dtype`` "float32" or "bfloat16"). Per sampled token,
``log rho = logp_trainer - logp_generator``; with no staleness and equal weights, every deviation of rho from 1
is numerical. Rows:

* gen f32 / train f32: the baseline (different code paths, same precision; should be ~1e-6).
* gen bf16 / train f32: a bf16-head generator against the FP32 trainer.
* gen f32 / train bf16: the reverse.
* gen bf16 / train bf16: both bf16 (same precision, but bf16 rounding of slightly different hidden states).

Columns: mean and max |log rho|, the 99th percentile, and the fraction of tokens with rho > 5 or rho < 0.2
(|log rho| > log 5), over all sampled tokens; ``H`` is the mean entropy (nats) of the FP32 sampling distribution
at those tokens, which sets how sharp the logits are. Models: the tiny preset (warm-started from an HF checkpoint
directory if ``--tiny-ckpt`` is given, else random with ``std = 1/sqrt(d_model)`` so that logits are O(1) rather
than nearly uniform) on arithmetic prompts, and the llama_100m shapes (random init, same rule) on random prompts.

XLA's default ``--xla_allow_excess_precision=true`` lets the compiler drop the bf16 rounding of the logits when the
bf16 matmul output is immediately cast to float32 (it keeps f32 accumulation of bf16-rounded inputs instead). On
CPU this happens in the engine's ``lm_logits`` but not in ``token_logprobs``, so by default the "bf16 head" is a
different precision on the two sides. ``--strict-bf16`` sets ``--xla_allow_excess_precision=false`` (before JAX
starts) so every bf16 head really rounds its logits to bf16, as a bf16-output GEMM does on accelerators.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

import numpy as np


def _random_params(cfg, seed: int, std: float | None):
    import jax

    from scalerl_jax.models import init_params

    return init_params(cfg, jax.random.key(seed), std=std if std is not None else 1.0 / math.sqrt(cfg.d_model))


def _generate(cfg, params, prompts: list[list[int]], head: str, *, n: int, max_new: int, seed: int):
    """Sample ``n`` completions per prompt with a JaxEngine whose head dtype is ``head``; returns
    [(prompt_ids, completion_ids, generator_logprobs)] over sampled (non-injected) tokens."""
    from scalerl_jax.rollout.engine import JaxEngine
    from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams

    gcfg = dataclasses.replace(cfg, head_dtype=head)
    max_len = max(len(p) for p in prompts) + max_new + 1
    engine = JaxEngine(gcfg, params, max_batch=min(64, len(prompts) * n), max_len=max_len, seed=seed)
    stop = (cfg.eos_token_id,) if cfg.eos_token_id is not None else ()
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new, stop_token_ids=stop, n=n)
    out = engine.generate([GenerationRequest(prompt_ids=list(p), params=sp) for p in prompts])
    rows = []
    for per_prompt in out:
        for c in per_prompt:
            assert not any(c.injected)
            rows.append((list(c.prompt_ids), list(c.token_ids), np.asarray(c.logprobs, np.float64)))
    return rows


def _trainer_logprobs(cfg, params, rows, head: str):
    """Log-probs (and FP32 entropies) of every completion token, recomputed the way the trainer does."""
    import jax
    import jax.numpy as jnp

    from scalerl_jax.losses.logprobs import token_logprobs
    from scalerl_jax.models import forward_hidden, head_weight

    L = max(len(p) + len(c) for p, c, _ in rows)
    pad = cfg.pad_token_id or 0
    seq = np.full((len(rows), L), pad, np.int32)
    for i, (p, c, _) in enumerate(rows):
        seq[i, : len(p) + len(c)] = p + c

    @jax.jit
    def fn(params, seq):
        h = forward_hidden(params, seq[:, :-1], cfg)
        logp, _ = token_logprobs(h, head_weight(params, cfg), seq[:, 1:], head_dtype=head)
        _, ent = token_logprobs(h, head_weight(params, cfg), seq[:, 1:], head_dtype="float32")
        return logp, ent

    logp, ent = jax.device_get(fn(params, jnp.asarray(seq)))
    lp, en = [], []
    for i, (p, c, _) in enumerate(rows):
        s = len(p) - 1  # target index of the first completion token
        lp.append(logp[i, s : s + len(c)].astype(np.float64))
        en.append(ent[i, s : s + len(c)].astype(np.float64))
    return lp, en


def _stats(rows, train_lp, ent) -> dict[str, float]:
    log_rho = np.concatenate([t - g for (_, _, g), t in zip(rows, train_lp)])
    a = np.abs(log_rho)
    return {
        "tokens": a.size, "mean": a.mean(), "p99": np.quantile(a, 0.99), "max": a.max(),
        "frac": float(np.mean(a > math.log(5.0))), "H": float(np.concatenate(ent).mean()),
    }


def run_model(label: str, cfg, params, prompts, *, n: int, max_new: int, seed: int) -> list[dict]:
    out = []
    for gen_head in ("float32", "bfloat16"):
        t0 = time.perf_counter()
        rows = _generate(cfg, params, prompts, gen_head, n=n, max_new=max_new, seed=seed)
        for train_head in ("float32", "bfloat16"):
            lp, ent = _trainer_logprobs(cfg, params, rows, train_head)
            out.append({"model": label, "gen": gen_head, "train": train_head, **_stats(rows, lp, ent)})
        print(f"  {label}: generated {len(rows)} completions with a {gen_head} head "
              f"({time.perf_counter() - t0:.1f} s incl. compile)", flush=True)
    order = {("float32", "float32"): 0, ("bfloat16", "float32"): 1, ("float32", "bfloat16"): 2,
             ("bfloat16", "bfloat16"): 3}
    return sorted(out, key=lambda r: order[(r["gen"], r["train"])])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny-ckpt", default=None, help="HF checkpoint dir of a warm-started tiny model")
    ap.add_argument("--models", nargs="+", default=["tiny", "llama_100m"])
    ap.add_argument("--init-std", type=float, default=None, help="random-init std (default 1/sqrt(d_model))")
    ap.add_argument("--tiny-prompts", type=int, default=64)
    ap.add_argument("--tiny-n", type=int, default=4)
    ap.add_argument("--tiny-max-new", type=int, default=24)
    ap.add_argument("--big-prompts", type=int, default=8)
    ap.add_argument("--big-n", type=int, default=2)
    ap.add_argument("--big-prompt-len", type=int, default=16)
    ap.add_argument("--big-max-new", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strict-bf16", action="store_true",
                    help="XLA --xla_allow_excess_precision=false: bf16 logits really rounded (set before JAX starts)")
    args = ap.parse_args(argv)
    if args.strict_bf16:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_allow_excess_precision=false").strip()

    from scalerl_jax.data.tasks import arith_problems
    from scalerl_jax.data.tokenizer import CharTokenizer
    from scalerl_jax.models.presets import get_preset

    results = []
    for name in args.models:
        if name == "tiny":
            if args.tiny_ckpt:
                from scalerl_jax.models.hf_io import load_hf_checkpoint

                params, cfg = load_hf_checkpoint(args.tiny_ckpt)
                label = "tiny (warm)"
            else:
                cfg = get_preset("tiny")
                params = _random_params(cfg, args.seed, args.init_std)
                label = "tiny (rand)"
            tok = CharTokenizer()
            prompts = [tok.encode(p.prompt) for p in arith_problems(args.tiny_prompts, seed=args.seed)]
            n, max_new = args.tiny_n, args.tiny_max_new
        else:
            cfg = get_preset(name)
            params = _random_params(cfg, args.seed, args.init_std)
            label = f"{name} (rand)"
            rng = np.random.default_rng(args.seed)
            prompts = rng.integers(3, cfg.vocab_size, (args.big_prompts, args.big_prompt_len)).tolist()
            n, max_new = args.big_n, args.big_max_new
        cfg = dataclasses.replace(cfg, head_dtype="float32")
        results += run_model(label, cfg, params, prompts, n=n, max_new=max_new, seed=args.seed)

    hdr = (f"{'model':<18} {'generator':<10} {'trainer':<10} {'tokens':>7} {'H nats':>7} {'mean|log rho|':>14} "
           f"{'p99':>9} {'max|log rho|':>13} {'rho>5 or <0.2':>14}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    prev = None
    for r in results:
        print(f"{r['model'] if r['model'] != prev else '':<18} {r['gen']:<10} {r['train']:<10} {r['tokens']:>7} "
              f"{r['H']:7.3f} {r['mean']:14.3e} {r['p99']:9.2e} {r['max']:13.3e} {r['frac']:14.4%}")
        prev = r["model"]
    import jax

    mode = "strict (excess precision off)" if "xla_allow_excess_precision=false" in os.environ.get("XLA_FLAGS", "") \
        else "XLA default (excess precision allowed)"
    print(f"\nbf16 rounding mode: {mode}; backend {jax.default_backend()}")
    print("log rho = logp_trainer - logp_generator per sampled token (same weights, same tokens; only the head "
          "precision differs).")


if __name__ == "__main__":
    main()
