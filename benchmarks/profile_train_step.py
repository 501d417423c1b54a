"""Where the CPU train step's time goes: a ``jax.profiler`` trace of the jitted step, each XLA op attributed to
the part of the model its HLO metadata names (forward / backward x attention, swiglu, lm_head, ...), and the
compiled program's op counts (dots, copies / transposes, the bytes they write).

    .venv/bin/python -m benchmarks.profile_train_step                    # tiny 128 x 40, as bench_train_step
    .venv/bin/python -m benchmarks.profile_train_step --model llama_100m --batch 2 --seq 128
    .venv/bin/python -m benchmarks.profile_train_step --rl                # the small preset's RL step, 256 x 68
    XLA_FLAGS=... .venv/bin/python -m benchmarks.profile_train_step --rl --no-trace   # time one XLA option

With ``--rl`` the step is the RL loop's own (``scalerl_jax.train.rl.rl_loss`` with the ``small`` preset's model,
loss and optimiser, ``make_train_step``, jitted, state donated) on a batch of the preset's shape: 256 rows of
prompt + completion (32 + 36 = 68 tokens), the loss on the last 36 of each row, vocabulary ``--vocab`` (the small
preset's BPE tokenizer has 512). It also prints the step's counted FLOPs (3 x forward over all B x T tokens,
padding included) over the 1024^3 matmul rate measured in the same process: the step's ratio to its floor. By
default each group's prompt is computed once (``train.shared_prefix``, the trainer's default); ``--plain`` times
every row running its own prompt, on the same tokens.

The step is the one ``benchmarks/bench_train_step.py`` times (``cross_entropy_loss`` -> ``make_train_step`` with
AdamW, jitted, state donated). Time shares come from the trace events of the XLA:CPU runtime (one per executed
op, matched to the compiled HLO by name); on a loaded machine absolute times inflate but shares stay comparable.
The op counts come from the compiled HLO text and do not depend on load at all. A ``conditional``'s event spans
its branch's ops, which have events of their own, so the optimiser update (``fwd:cond``) is counted about twice.

Measured here (2-core CPU shared with other jobs; one run each, shares of the traced op time):

- tiny 128 x 40, before ``dense_attention`` took head-major operands: dots 58 %, copies / transposes 9.5 % (67 ops
  writing 114.7 MiB per step, nearly all in attention's forward and backward), the SwiGLU's elementwise fusions
  (silu's divide, the products) ~20 %; by part: forward SwiGLU 38 %, forward attention 22 %, backward SwiGLU 19 %,
  backward attention 12 %. After: copies / transposes 4.6 % (44 ops, 47.9 MiB), dots 64 %.
- llama_100m 2 x 128: dots 52 % (the LM head's weight gradient alone 8 %), the per-layer weight slices that the
  unrolled layer loop copies out of the stacked [L, ...] parameters 19 %, AdamW's update ~11 % (plus its
  double-counted ``cond``), the zero-filled gradients of the embedding gather and the target gather 7 %.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import re
import statistics
import tempfile
import time

import numpy as np

PARTS = ("lm_head", "swiglu", "attention", "log_softmax", "cond", "layer")


def part_of(op_name: str) -> str:
    """'fwd:attention', 'bwd:swiglu', ... from an HLO op_name (``transpose(jvp())`` marks the backward pass)."""
    side = "bwd" if "transpose(" in op_name else "fwd"
    for p in PARTS:
        if p in op_name:
            return f"{side}:{p}"
    return f"{side}:other"


def kind_of(instr: str) -> str:
    """Coarse kind of a compiled HLO instruction name: dot, copy/transpose or the fusion's kind prefix."""
    head = instr.split(".")[0]
    if head.startswith(("ynn_fusion", "xnn_fusion", "dot")):
        return "dot"
    if "copy" in head or "transpose" in head:
        return "copy/transpose"
    return head


def hlo_stats(hlo: str) -> tuple[dict[str, str], collections.Counter, collections.Counter]:
    """(instruction -> op_name, op count by kind, output bytes by kind) of the entry computation."""
    meta = {m.group(1): m.group(2)
            for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?metadata=\{op_name=\"([^\"]*)\"", hlo, re.M)}
    count, nbytes = collections.Counter(), collections.Counter()
    entry = hlo[hlo.index("\nENTRY"):]
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]", entry, re.M):
        name, dt, dims = m.groups()
        k = kind_of(name)
        k = k if k in ("dot", "copy/transpose") else "other"
        count[k] += 1
        nbytes[k] += int(np.prod([int(d) for d in dims.split(",") if d])) * np.dtype(
            {"f32": np.float32, "s32": np.int32, "bf16": np.float16, "pred": np.bool_}.get(dt, np.float32)).itemsize
    return meta, count, nbytes


def sft_step(model: str, batch: int, seq: int):
    """(config, jitted step, state, batch) of the cross-entropy step bench_train_step times."""
    import jax
    import jax.numpy as jnp

    from scalerl_jax.config import TrainConfig
    from scalerl_jax.models import init_params
    from scalerl_jax.models.presets import get_preset
    from scalerl_jax.train.losses import cross_entropy_loss
    from scalerl_jax.train.optim import make_optimizer
    from scalerl_jax.train.step import init_train_state, make_train_step

    cfg = get_preset(model)
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, seq + 1))
    opt = make_optimizer(TrainConfig(lr=1e-4, warmup_steps=0, schedule="constant", adam_eps=1e-8, weight_decay=0.01,
                                     grad_clip=0.0))
    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, cfg.vocab_size)
    data = {"tokens": tokens, "loss_mask": jnp.ones(tokens.shape, jnp.float32)}
    step = jax.jit(make_train_step(cross_entropy_loss(cfg), opt), donate_argnums=(0,))
    return cfg, step, init_train_state(init_params(cfg, jax.random.key(0)), opt), data


def rl_step(vocab: int, shared: bool = True):
    """(config, jitted step, state, batch) of the ``small`` preset's RL train step on a batch of its shape: every
    prompt fills its 32 columns, so the plain rows and the split layout hold the same tokens; ``shared``: each
    group's prompt computed once (``train.shared_prefix``), else every row's."""
    import jax
    from scalerl_jax.experiments.presets import small_plan

    from scalerl_jax.models import init_params
    from scalerl_jax.train.optim import make_optimizer
    from scalerl_jax.train.rl import rl_loss
    from scalerl_jax.train.step import init_train_state, make_train_step

    exp = small_plan(0).exp
    cfg = dataclasses.replace(exp.model, vocab_size=vocab)
    rows = exp.rollout.prompts_per_batch * exp.rollout.group_size
    prompt, new = exp.rollout.max_prompt_len, exp.rollout.max_new_tokens
    opt = make_optimizer(exp.train)
    layout = (prompt, exp.rollout.group_size) if shared else None
    step = jax.jit(make_train_step(rl_loss(cfg, exp.loss, temperature=exp.rollout.temperature, shared_prefix=layout),
                                   opt, exp.train.microbatches), donate_argnums=(0,))
    rng = np.random.default_rng(0)
    shape = (rows, prompt + new)
    mask = np.zeros(shape, np.float32)
    mask[:, prompt:] = 1.0
    data = {"tokens": rng.integers(0, vocab, shape).astype(np.int32), "loss_mask": mask,
            "gen_logp": np.full(shape, -1.0, np.float32), "staleness": np.zeros(shape, np.int32),
            "advantages": rng.normal(size=rows).astype(np.float32), "rewards": rng.random(rows).astype(np.float32),
            "group_ids": (np.arange(rows) // exp.rollout.group_size).astype(np.int32),
            "truncated": np.zeros(rows, np.float32), "prompt_len": np.full(rows, prompt, np.int32)}
    return cfg, step, init_train_state(init_params(cfg, jax.random.key(0)), opt), data


def profile(model: str, batch: int, seq: int, steps: int, top: int, rl: bool = False, vocab: int = 512,
            trace: bool = True, shared: bool = True) -> None:
    import jax
    from scalerl_jax.benchmarks import machine

    cfg, step, state, data = rl_step(vocab, shared) if rl else sft_step(model, batch, seq)
    t0 = time.perf_counter()
    meta, count, nbytes = hlo_stats(step.lower(state, data).compile().as_text())
    compile_s = time.perf_counter() - t0
    for _ in range(2):
        state, m = step(state, data)
        jax.block_until_ready(m)
    if rl:
        rate = machine.matmul_flops_per_s()
        b, t = data["tokens"].shape
        flops = 3 * cfg.flops_per_token(t) * b * t
        timed = []
        for _ in range(max(steps, 10)):
            t0 = time.perf_counter()
            state, m = step(state, data)
            jax.block_until_ready(m)
            timed.append(time.perf_counter() - t0)
        med = statistics.median(timed)
        print(machine.header(machine.describe(matmul=False)))
        rows = "shared prefixes" if shared else "plain rows"
        print(f"RL step (small, {b} x {t}, vocab {cfg.vocab_size}, {rows}): compile {compile_s:.1f} s; median "
              f"{med * 1e3:.0f} ms over {len(timed)} steps (min {min(timed) * 1e3:.0f}, max {max(timed) * 1e3:.0f}); "
              f"{flops / 1e9:.1f} GFLOP counted, {flops / med / 1e9:.1f} GFLOP/s against a 1024^3 matmul's "
              f"{rate / 1e9:.1f}: {med / (flops / rate):.2f}x the floor")
        model, batch, seq = "small RL", b, t
        if not trace:
            return
    walls = []
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        for _ in range(steps):
            t0 = time.perf_counter()
            state, m = step(state, data)
            jax.block_until_ready(m)
            walls.append(time.perf_counter() - t0)
        jax.profiler.stop_trace()
        trace = sorted(glob.glob(f"{d}/**/*.trace.json.gz", recursive=True))[-1]
        events = json.load(gzip.open(trace))["traceEvents"]
    by_part, by_kind, by_op = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("name") in meta:
            op = e["name"]
            by_part[part_of(meta[op])] += e["dur"]
            by_kind[kind_of(op)] += e["dur"]
            by_op[op] += e["dur"]
    total = max(sum(by_part.values()), 1)
    print(f"{model} {batch}x{seq}: median step {statistics.median(walls) * 1e3:.1f} ms over {steps}; XLA ops "
          f"{total / steps / 1e3:.1f} ms/step")
    print("compiled entry computation: " + ", ".join(
        f"{k} {count[k]} ops / {nbytes[k] / 2**20:.1f} MiB written" for k in ("dot", "copy/transpose", "other")))
    for title, table in (("by model part", by_part), ("by op kind", by_kind)):
        print(f"\n{title}:")
        for k, v in table.most_common(12):
            print(f"  {v / total:6.1%} {v / steps / 1e3:9.2f} ms  {k}")
    print(f"\ntop {top} ops:")
    for k, v in by_op.most_common(top):
        print(f"  {v / total:6.1%} {v / steps / 1e3:9.2f} ms  {k:<28} {meta[k][-80:]}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=40)
    ap.add_argument("--steps", type=int, default=5, help="traced steps (after 2 untraced)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--rl", action="store_true", help="the small preset's RL train step (--model/--batch/--seq unused)")
    ap.add_argument("--vocab", type=int, default=512, help="with --rl: the vocabulary size")
    ap.add_argument("--no-trace", action="store_true", help="with --rl: only time the step, no trace")
    ap.add_argument("--plain", action="store_true", help="with --rl: every row computes its own prompt "
                    "(train.shared_prefix=False)")
    a = ap.parse_args(argv)
    profile(a.model, a.batch, a.seq, a.steps, a.top, rl=a.rl, vocab=a.vocab, trace=not a.no_trace, shared=not a.plain)


if __name__ == "__main__":
    main()
