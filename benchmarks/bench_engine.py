"""Decode throughput of the JaxEngine vs HF transformers ``generate()`` on the same CPU, weights and workload.

Both sides load the same random checkpoint (written with :func:`save_hf_checkpoint`), run greedy decoding of
``--new`` tokens after ``--prompt``-token prompts with no stop token (so every row generates exactly ``--new``
tokens), at each batch size. Times exclude compilation / warm-up (one untimed call first) and are the best of
``--reps``. Also times the tiny RL workload (32 prompts x 8 samples, ~8 prompt + 24 new tokens, sampled).

    .venv/bin/python -m benchmarks.bench_engine [--models tiny,llama_100m] [--batches 8,32]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import numpy as np

from scalerl_jax.models import init_params, presets
from scalerl_jax.models.hf_io import save_hf_checkpoint
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams


def _best(fn, reps: int) -> float:
    fn()  # warm-up / compile
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_model(name: str, batches: list[int], prompt_len: int, new: int, reps: int, threads: int) -> list[tuple]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    cfg = presets.get_preset(name)
    params = init_params(cfg, jax.random.PRNGKey(0))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        save_hf_checkpoint(params, cfg, d)
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        eng = JaxEngine.from_hf(d, max_batch=max(batches), max_len=prompt_len + new, decode_chunk=16)
        rng = np.random.default_rng(0)
        for B in batches:
            prompts = rng.integers(3, cfg.vocab_size, size=(B, prompt_len))
            reqs = [GenerationRequest(prompt_ids=p.tolist(), params=SamplingParams(temperature=0.0, max_new_tokens=new))
                    for p in prompts]
            ids = torch.tensor(prompts)

            def run_hf():
                with torch.no_grad():
                    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                                      min_new_tokens=new, pad_token_id=0, eos_token_id=None)
                assert out.shape == (B, prompt_len + new)

            def run_engine():
                outs = eng.generate(reqs)
                assert all(len(o[0].token_ids) == new for o in outs)

            t_hf, t_eng = _best(run_hf, reps), _best(run_engine, reps)
            rows.append((name, B, prompt_len, new, B * new / t_hf, B * new / t_eng, t_hf / t_eng))
    return rows


def bench_tiny_rl(reps: int) -> tuple[float, int]:
    """The tiny RL batch: 32 prompts x 8 samples, 6-10 prompt tokens, up to 24 sampled tokens (eos stops)."""
    cfg = presets.tiny()
    eng = JaxEngine(cfg, init_params(cfg, jax.random.PRNGKey(0)), max_batch=256, max_len=64, decode_chunk=8)
    rng = np.random.default_rng(0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=24, stop_token_ids=(1,), n=8)
    reqs = [GenerationRequest(prompt_ids=rng.integers(2, 16, size=rng.integers(6, 11)).tolist(), params=sp)
            for _ in range(32)]
    out = eng.generate(reqs)
    return _best(lambda: eng.generate(reqs), reps), sum(len(c.token_ids) for o in out for c in o)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,llama_100m")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (match the CPU cores)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for m in args.models.split(","):
        rows += bench_model(m, batches, args.prompt, args.new, args.reps, args.threads)
    print(f"\n{'model':<12}{'batch':>6}{'prompt':>8}{'new':>5}{'HF tok/s':>12}{'JAX tok/s':>12}{'ratio':>8}")
    for name, B, P, N, hf, jx, ratio in rows:
        print(f"{name:<12}{B:>6}{P:>8}{N:>5}{hf:>12.0f}{jx:>12.0f}{ratio:>7.1f}x")
    t, n_tok = bench_tiny_rl(args.reps)
    print(f"\ntiny RL batch (32 prompts x 8 samples, <=24 new tokens, sampled): {t:.3f} s, {n_tok} tokens")


if __name__ == "__main__":
    main()
