"""Train-step throughput and model FLOP utilisation: our jitted JAX step against the same step in PyTorch.

    .venv/bin/python -m benchmarks.bench_train_step                      # tiny + llama_100m, a few minutes on 2 cores
    .venv/bin/python -m benchmarks.bench_train_step --models tiny --steps 10

For each model both sides start from the same weights (random init, saved with ``save_hf_checkpoint`` and loaded
into HF ``LlamaForCausalLM``), see the same batch of random tokens and run the same update: next-token
cross-entropy (mean over all B x T targets) -> backward -> AdamW (weight decay on matrices only, no clipping).

* JAX: ``make_train_step(cross_entropy_loss(cfg), make_optimizer(...))`` under ``jax.jit`` with the state donated
  (the step also computes the global gradient norm and the finite-check that guards every update).
* PyTorch: ``LlamaForCausalLM`` (float32, default attention implementation), ``F.cross_entropy`` on the logits,
  ``loss.backward()``, ``torch.optim.AdamW`` (``foreach``), ``zero_grad(set_to_none=True)``; torch threads = 2.

The two sides' steps are interleaved (one JAX step, one torch step, ...) after warm-up, so load from other
processes hits both alike; the table reports medians. ``cpu s`` is the process CPU time per step (all threads):
on a shared machine it is steadier than wall time. MFU = 3 x ``ModelConfig.flops_per_token(T)`` x tokens/s
divided by the peak measured in the same run: the best FLOP/s of a jitted 2048^3 float32 ``jnp.matmul``
(torch's ``torch.mm`` on the same shapes is printed beside it). The first-step losses of both sides are printed
as a check that they compute the same thing.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

import numpy as np


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def measure_peak(n: int = 2048, repeats: int = 5) -> tuple[float, float]:
    """Best achieved FLOP/s of an n x n x n float32 matmul: (jax, torch)."""
    import jax
    import jax.numpy as jnp
    import torch

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    mm(a, b).block_until_ready()
    t_jax = min(_timed(lambda: mm(a, b).block_until_ready())[1] for _ in range(repeats))
    ta, tb = torch.from_numpy(np.array(a)), torch.from_numpy(np.array(b))
    torch.mm(ta, tb)
    t_torch = min(_timed(lambda: torch.mm(ta, tb))[1] for _ in range(repeats))
    flops = 2.0 * n**3
    return flops / t_jax, flops / t_torch


def bench_model(name: str, batch: int, seq: int, steps: int, warmup: int, lr: float, wd: float) -> dict:
    import jax
    import jax.numpy as jnp
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    from scalerl_jax.config import TrainConfig
    from scalerl_jax.models import init_params
    from scalerl_jax.models.hf_io import save_hf_checkpoint
    from scalerl_jax.models.presets import get_preset
    from scalerl_jax.train.losses import cross_entropy_loss
    from scalerl_jax.train.optim import make_optimizer
    from scalerl_jax.train.step import init_train_state, make_train_step

    cfg = get_preset(name)
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, seq + 1))
    params = init_params(cfg, jax.random.key(0))
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, cfg.vocab_size), np.int32)

    # ---- JAX ----
    tcfg = TrainConfig(lr=lr, warmup_steps=0, schedule="constant", adam_eps=1e-8, weight_decay=wd, grad_clip=0.0)
    optimizer = make_optimizer(tcfg)
    step = jax.jit(make_train_step(cross_entropy_loss(cfg), optimizer), donate_argnums=(0,))
    jbatch = {"tokens": jnp.asarray(tokens), "loss_mask": jnp.ones(tokens.shape, jnp.float32)}

    # ---- PyTorch, from the same weights ----
    with tempfile.TemporaryDirectory() as d:
        save_hf_checkpoint(params, cfg, d)
        model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    topt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(tcfg.adam_b1, tcfg.adam_b2), eps=1e-8, foreach=True)
    tin = torch.from_numpy(tokens[:, :-1]).long()
    ttgt = torch.from_numpy(tokens[:, 1:]).long()

    def torch_step():
        logits = model(input_ids=tin).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ttgt.reshape(-1))
        loss.backward()
        topt.step()
        topt.zero_grad(set_to_none=True)
        return float(loss.detach())

    state = init_train_state(params, optimizer)
    t0 = time.perf_counter()
    state, m = step(state, jbatch)
    jax_loss0 = float(m["loss"])
    compile_s = time.perf_counter() - t0
    torch_loss0 = torch_step()
    for _ in range(warmup):
        state, m = step(state, jbatch)
        jax.block_until_ready(m)
        torch_step()

    jw, jc, tw, tc = [], [], [], []
    for _ in range(steps):
        def jax_step():
            nonlocal state
            state, mm = step(state, jbatch)
            return jax.block_until_ready(mm)

        _, w, c = _timed(jax_step)
        jw.append(w)
        jc.append(c)
        _, w, c = _timed(torch_step)
        tw.append(w)
        tc.append(c)
    return {
        "model": name, "params": cfg.num_params(), "B": batch, "T": seq, "tokens": batch * seq,
        "flops_step": 3.0 * cfg.flops_per_token(seq) * batch * seq,
        "jax_s": statistics.median(jw), "jax_cpu": statistics.median(jc),
        "torch_s": statistics.median(tw), "torch_cpu": statistics.median(tc),
        "jax_loss0": jax_loss0, "torch_loss0": torch_loss0, "compile_s": compile_s,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny", "llama_100m"])
    ap.add_argument("--tiny-batch", type=int, default=128)
    ap.add_argument("--tiny-seq", type=int, default=40)
    ap.add_argument("--big-batch", type=int, default=2, help="batch for the other presets")
    ap.add_argument("--big-seq", type=int, default=128, help="sequence length for the other presets")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per side (after warm-up)")
    ap.add_argument("--big-steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per side after the compile step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--torch-threads", type=int, default=2)
    args = ap.parse_args(argv)

    import jax
    import torch

    torch.set_num_threads(args.torch_threads)
    peak_jax, peak_torch = measure_peak()
    from scalerl_jax.benchmarks import machine

    print(machine.header(machine.describe()))
    print(f"devices: {jax.devices()}  torch threads: {torch.get_num_threads()}")
    print(f"measured peak (2048^3 f32 matmul): jnp.matmul {peak_jax / 1e9:.1f} GFLOP/s, "
          f"torch.mm {peak_torch / 1e9:.1f} GFLOP/s; MFU below is against the jnp.matmul figure\n")
    rows = []
    for name in args.models:
        tiny = name == "tiny"
        r = bench_model(name, args.tiny_batch if tiny else args.big_batch, args.tiny_seq if tiny else args.big_seq,
                        args.steps if tiny else args.big_steps, args.warmup, args.lr, args.weight_decay)
        rows.append(r)
        print(f"{name}: first-step loss jax {r['jax_loss0']:.5f} torch {r['torch_loss0']:.5f}; "
              f"jax compile+first step {r['compile_s']:.1f} s", flush=True)

    hdr = (f"{'model':<11} {'params':>7} {'B x T':>8} {'side':<6} {'step s':>7} {'cpu s':>6} {'tok/s':>8} "
           f"{'GFLOP/s':>8} {'MFU':>6}  {'jax/torch speed (wall, cpu)':>27}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in rows:
        for side in ("jax", "torch"):
            s = r[f"{side}_s"]
            fl = r["flops_step"] / s
            ratio = ""
            if side == "jax":
                ratio = f"{r['torch_s'] / r['jax_s']:.2f}x, {r['torch_cpu'] / r['jax_cpu']:.2f}x"
            print(f"{r['model'] if side == 'jax' else '':<11} {r['params'] / 1e6:6.1f}M {r['B']:>3}x{r['T']:<4} "
                  f"{side:<6} {s:7.3f} {r[f'{side}_cpu']:6.2f} {r['tokens'] / s:8.0f} {fl / 1e9:8.1f} "
                  f"{fl / peak_jax:6.1%}  {ratio:>27}")
    print("\nratio > 1: the JAX step is faster. step s / cpu s: medians of the interleaved timed steps.")


if __name__ == "__main__":
    main()
