"""What the Qwen architectures cost beside Llama's on CPU: the dense train step, and the MoE layer's dispatch.

    .venv/bin/python -m benchmarks.bench_archs                   # both parts, ~5 minutes on 2 cores
    .venv/bin/python -m benchmarks.bench_archs --part dense --steps 8

**dense**: the jitted supervised train step (next-token cross-entropy -> backward -> AdamW, the state donated:
``make_train_step(cross_entropy_loss(cfg), make_optimizer(...))``, as ``bench_train_step`` runs it) of the
``llama_100m`` preset (124M) and of the same shapes as Qwen2 (``arch="qwen2"``: q/k/v biases) and as Qwen3
(``arch="qwen3"``: per-head q/k RMSNorm before RoPE). Same widths, heads, layers, vocabulary, tied-ness and batch,
so the ratio is what the architecture itself adds. The three steps are interleaved (one of each, in turn) after
warm-up, so load from other processes hits all alike; medians of wall and process-CPU time are reported, and
tokens/s and the ratio to Llama are computed from them.

**moe**: one MoE layer, forward + backward (``value_and_grad`` w.r.t. the input and every weight), at the two
families' routing shapes scaled to the same width and the same active expert FLOPs per token:

* Llama-4 (Scout's shape): 16 experts, top-1 of the sigmoid router, expert width F, plus a shared expert of width F;
* Qwen3-MoE (30B-A3B's shape): 128 experts, top-8 of the renormalised softmax, expert width F/4, no shared expert;
* the floor: one dense SwiGLU of width 2F (the same matmul FLOPs per token, no routing or dispatch).

Both MoE layers run the ``ragged`` path (sort by expert + ``jax.lax.ragged_dot``) on one device, and expert-
parallel over a mesh of 8 simulated CPU devices (``--ep`` shards of the ``expert`` axis): the dispatch cost per
token is the layer's time over the floor's, per token. The simulated devices share this machine's cores: EP rows
show the work each path does (sorting, all-to-all buffers), not multi-chip scaling.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def bench_dense(preset: str, batch: int, seq: int, steps: int, warmup: int) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from scalerl_jax.config import TrainConfig
    from scalerl_jax.models import init_params
    from scalerl_jax.models.presets import get_preset
    from scalerl_jax.train.losses import cross_entropy_loss
    from scalerl_jax.train.optim import make_optimizer
    from scalerl_jax.train.step import init_train_state, make_train_step

    base = get_preset(preset)
    base = dataclasses.replace(base, max_seq_len=max(base.max_seq_len, seq + 1))
    cfgs = {"llama": base, "qwen2": dataclasses.replace(base, arch="qwen2"),
            "qwen3": dataclasses.replace(base, arch="qwen3")}
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, base.vocab_size), np.int32)
    jbatch = {"tokens": jnp.asarray(tokens), "loss_mask": jnp.ones(tokens.shape, jnp.float32)}
    tcfg = TrainConfig(lr=1e-4, warmup_steps=0, schedule="constant", adam_eps=1e-8, weight_decay=0.01, grad_clip=0.0)
    sides = {}
    for name, cfg in cfgs.items():
        opt = make_optimizer(tcfg)
        step = jax.jit(make_train_step(cross_entropy_loss(cfg), opt), donate_argnums=(0,))
        state = init_train_state(init_params(cfg, jax.random.key(0)), opt)
        t0 = time.perf_counter()
        state, m = step(state, jbatch)
        loss0 = float(m["loss"])
        sides[name] = {"cfg": cfg, "step": step, "state": state, "loss0": loss0,
                       "compile_s": time.perf_counter() - t0, "wall": [], "cpu": []}
        print(f"  {name}: {cfg.num_params() / 1e6:.1f}M params, compile + first step {sides[name]['compile_s']:.1f} s, "
              f"first loss {loss0:.4f}", flush=True)

    def run(s):
        s["state"], mm = s["step"](s["state"], jbatch)
        return jax.block_until_ready(mm)

    for i in range(warmup + steps):
        for s in sides.values():
            _, w, c = _timed(lambda s=s: run(s))
            if i >= warmup:
                s["wall"].append(w)
                s["cpu"].append(c)
    rows = []
    for name, s in sides.items():
        wall, cpu = statistics.median(s["wall"]), statistics.median(s["cpu"])
        rows.append({"arch": name, "params": s["cfg"].num_params(), "wall_s": wall, "cpu_s": cpu,
                     "spread": (min(s["wall"]), max(s["wall"])), "tok_s": batch * seq / wall,
                     "loss0": s["loss0"]})
    ref = rows[0]
    for r in rows:
        r["vs_llama_wall"] = ref["wall_s"] / r["wall_s"]
        r["vs_llama_cpu"] = ref["cpu_s"] / r["cpu_s"]
    return rows


def moe_configs(d: int, ffn: int):
    from scalerl_jax.models.presets import tiny_moe

    base = dataclasses.replace(tiny_moe(), d_model=d, expert_ffn_dim=ffn)
    llama4 = dataclasses.replace(base, arch="llama4", n_experts=16, top_k=1)
    qwen = dataclasses.replace(base, arch="qwen3_moe", n_experts=128, top_k=8, expert_ffn_dim=ffn // 4,
                               norm_topk_prob=True, qk_norm=False, attn_temp_tuning=False, nope_every=0,
                               local_attn_chunk=None, rope_theta=1e6)
    return {"llama4 16e top-1 + shared": llama4, "qwen3_moe 128e top-8": qwen}


def bench_moe(tokens: int, d: int, ffn: int, reps: int, ep: int) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from scalerl_jax.benchmarks.bench_moe import median_time, time_layer

    from scalerl_jax.config import MeshConfig
    from scalerl_jax.models import layers as nn
    from scalerl_jax.models.moe import moe_ffn

    rng = np.random.RandomState(0)
    B, T = 8, tokens // 8
    h = rng.randn(B, T, d).astype(np.float32)
    ct = rng.randn(B, T, d).astype(np.float32)

    # the floor: a dense SwiGLU of width 2 x ffn (= the active expert width of both MoE layers)
    dw = {"w_gate": 0.05 * rng.randn(d, 2 * ffn).astype(np.float32),
          "w_up": 0.05 * rng.randn(d, 2 * ffn).astype(np.float32),
          "w_down": 0.05 * rng.randn(2 * ffn, d).astype(np.float32)}
    floor = jax.jit(jax.value_and_grad(
        lambda h, w: jnp.sum(nn.swiglu(h, w["w_gate"], w["w_up"], w["w_down"], jnp.float32) * ct), argnums=(0, 1)))
    t_floor = median_time(floor, (h, dw), reps)
    rows = [{"layer": f"dense SwiGLU, width {2 * ffn}", "path": "1 device", "seconds": t_floor}]

    for name, cfg in moe_configs(d, ffn).items():
        E, F = cfg.n_experts, cfg.expert_ffn_dim
        mp = {"router": rng.randn(d, E).astype(np.float32),
              "w_gate": 0.05 * rng.randn(E, d, F).astype(np.float32),
              "w_up": 0.05 * rng.randn(E, d, F).astype(np.float32),
              "w_down": 0.05 * rng.randn(E, F, d).astype(np.float32)}
        if cfg.shared_expert:
            mp |= {"shared_gate": 0.05 * rng.randn(d, F).astype(np.float32),
                   "shared_up": 0.05 * rng.randn(d, F).astype(np.float32),
                   "shared_down": 0.05 * rng.randn(F, d).astype(np.float32)}
        g = jax.value_and_grad(lambda h, mp, c=cfg: jnp.sum(moe_ffn(h, mp, c)[0] * ct), argnums=(0, 1))
        rows.append({"layer": name, "path": "ragged, 1 device", "seconds": time_layer(g, cfg, h, mp, None, reps)})
        t = time_layer(g, cfg, h, mp, MeshConfig(fsdp=len(jax.devices()) // ep, expert=ep), reps)
        rows.append({"layer": name, "path": f"expert-parallel, {ep} of {len(jax.devices())} devices", "seconds": t})
    for r in rows:
        r["us_per_token"] = r["seconds"] / tokens * 1e6
        r["dispatch_us_per_token"] = (r["seconds"] - t_floor) / tokens * 1e6
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["dense", "moe", "both"], default="both")
    ap.add_argument("--preset", default="llama_100m", help="dense: the Llama model preset whose shapes all three take")
    ap.add_argument("--batch", type=int, default=2, help="dense: rows per train step")
    ap.add_argument("--seq", type=int, default=128, help="dense: tokens per row")
    ap.add_argument("--steps", type=int, default=5, help="dense: timed steps per architecture (after warm-up)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=2048, help="moe: tokens per call (8 rows)")
    ap.add_argument("--d", type=int, default=128, help="moe: model width")
    ap.add_argument("--ffn", type=int, default=256, help="moe: Llama-4 expert width F (Qwen3-MoE's is F/4)")
    ap.add_argument("--reps", type=int, default=3, help="moe: timed calls per row (median)")
    ap.add_argument("--ep", type=int, default=4, help="moe: size of the expert mesh axis")
    args = ap.parse_args(argv)

    import jax
    from scalerl_jax.benchmarks import machine

    print(machine.header(machine.describe()))
    print(f"{len(jax.devices())} CPU devices")
    if args.part in ("dense", "both"):
        print(f"\ndense train step, {args.preset} shapes, {args.batch} x {args.seq} tokens, "
              f"{args.steps} timed steps each, interleaved")
        rows = bench_dense(args.preset, args.batch, args.seq, args.steps, args.warmup)
        print("arch | params | step s (median) | min-max | cpu s | tokens/s | Llama / this (wall) | (cpu)")
        print("--- | --- | --- | --- | --- | --- | --- | ---")
        for r in rows:
            print(f"{r['arch']} | {r['params'] / 1e6:.2f}M | {r['wall_s']:.3f} | {r['spread'][0]:.3f}-"
                  f"{r['spread'][1]:.3f} | {r['cpu_s']:.2f} | {r['tok_s']:.0f} | {r['vs_llama_wall']:.3f}x | "
                  f"{r['vs_llama_cpu']:.3f}x", flush=True)
        print("a ratio below 1: the architecture's step is slower than Llama's at the same shapes.")
    if args.part in ("moe", "both"):
        print(f"\nMoE layer fwd+bwd, {args.tokens} tokens, d {args.d}; active expert width {2 * args.ffn} per token "
              f"in both layers")
        rows = bench_moe(args.tokens, args.d, args.ffn, args.reps, args.ep)
        print("layer | path | ms / call | us / token | dispatch us / token (over the floor)")
        print("--- | --- | --- | --- | ---")
        for r in rows:
            print(f"{r['layer']} | {r['path']} | {r['seconds'] * 1e3:.1f} | {r['us_per_token']:.2f} | "
                  f"{r['dispatch_us_per_token']:.2f}", flush=True)
        by = {(r["layer"].split()[0], r["path"].split(",")[0]): r for r in rows}
        for path in ("ragged", "expert-parallel"):
            q, l4 = by[("qwen3_moe", path)], by[("llama4", path)]
            print(f"{path}: Qwen3-MoE / Llama-4 time per token {q['seconds'] / l4['seconds']:.2f}x; dispatch per "
                  f"token {q['dispatch_us_per_token'] / max(l4['dispatch_us_per_token'], 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
