"""PipelineRL-k against PPO-off-policy-k on the tiny run (RECIPE.md section 3), in one process.

From the same supervised warm start (cached as an HF checkpoint), each mode runs the smoke preset's RL loop for
the same number of steps. Printed per mode: trainer and generator busy fractions (of the RL wall time), the
compute (device-seconds, eval excluded) and wall time at which validation reward first reaches a fixed target,
best/final validation reward, and the blocking part of a checkpoint save against the mean train-step time.

    .venv/bin/python -m benchmarks.bench_pipeline [--steps 64] [--k 8] [--target-gain 0.15]

The warm start is computed once (smoke preset, 512 steps) and kept in --warmstart (default
/tmp/scalerl_bench_warmstart).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=8)
    ap.add_argument("--target-gain", type=float, default=0.15, help="target = step-0 val reward + this")
    ap.add_argument("--warmstart", default="/tmp/scalerl_bench_warmstart")
    ap.add_argument("--out", default="/tmp/scalerl_bench_pipeline")
    a = ap.parse_args()

    import jax
    from scalerl_jax.experiments.presets import smoke_plan
    from scalerl_jax.experiments.run_path import build_trainer

    from scalerl_jax.data.pipeline import build_prompt_data
    from scalerl_jax.data.tokenizer import CharTokenizer
    from scalerl_jax.metrics import read_metrics
    from scalerl_jax.models.hf_io import load_hf_checkpoint, save_hf_checkpoint
    from scalerl_jax.train.warmstart import warm_start

    R = dataclasses.replace
    base = smoke_plan(0)
    exp = base.exp
    data = build_prompt_data("arith", val_size=exp.data.val_size, seed=exp.data.seed)
    ws = Path(a.warmstart)
    if (ws / "config.json").exists():
        params, _ = load_hf_checkpoint(ws)
        print(f"[bench] warm start from {ws}")
    else:
        tok = CharTokenizer()
        t0 = time.time()
        params = warm_start(exp.model, data.train, encode=tok.encode, eos_id=tok.eos_id, pad_id=tok.pad_id,
                            seq_len=base.seq_len, steps=base.warm_steps, batch_size=base.warm_batch, lr=base.warm_lr,
                            warmup=base.warm_warmup, seed=0, unmarked_frac=base.warm_unmarked_frac)
        save_hf_checkpoint(params, exp.model, ws)
        print(f"[bench] warm start computed in {time.time() - t0:.0f}s, cached in {ws}")
    params = jax.tree.map(np.asarray, params)

    results = {}
    for mode in ("pipeline", "ppo_off_policy"):
        run_dir = Path(a.out) / mode
        e = R(exp, out_dir=str(run_dir), rollout=R(exp.rollout, mode=mode, k=a.k),
              train=R(exp.train, steps=a.steps, eval_every=a.eval_every, checkpoint_every=a.checkpoint_every))
        plan = R(base, exp=e)
        trainer = build_trainer(plan, params, data, tok=CharTokenizer(), log=lambda s: None)
        blocking = []
        save = trainer.core.ckpt.save

        def timed_save(step, state, extras, _save=save, _ck=trainer.core.ckpt, _b=blocking):
            _save(step, state, extras)
            _b.append(_ck.last_blocking_s)

        trainer.core.ckpt.save = timed_save
        t0 = time.time()
        try:
            summary = trainer.run()
        finally:
            trainer.close()
        wall = time.time() - t0
        evals = read_metrics(run_dir, "eval")
        trains = read_metrics(run_dir, "train")
        results[mode] = dict(summary=summary, evals=evals, wall=wall, blocking=blocking,
                             step_s=float(np.mean([r["step_seconds"] for r in trains[1:]])) if len(trains) > 1 else
                             float("nan"))
        print(f"[bench] {mode}: {summary['steps']} steps in {summary['wall_seconds']:.0f}s RL wall "
              f"(+ eval {summary['eval_s']:.0f}s); val {[round(r['val_reward'], 3) for r in evals]}", flush=True)

    v0 = results["pipeline"]["evals"][0]["val_reward"]
    target = v0 + a.target_gain
    print(f"\nPipelineRL-{a.k} vs PPO-off-policy-{a.k}, tiny model, {exp.rollout.prompts_per_batch} prompts x "
          f"{exp.rollout.group_size}, {a.steps} steps; target val reward {target:.3f} (step-0 {v0:.3f} + "
          f"{a.target_gain})\n")
    hdr = ("mode", "trainer busy", "gen busy", "RL wall s", "dev-s to target", "step to target", "best val",
           "final val", "step s", "ckpt block s")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for mode, r in results.items():
        s = r["summary"]
        hit = next((e for e in r["evals"] if e["val_reward"] >= target), None)
        cells = (mode, f"{s['trainer_busy_fraction']:.2f}", f"{s['generator_busy_fraction']:.2f}",
                 f"{s['wall_seconds']:.0f}", f"{hit['device_seconds']:.0f}" if hit else "not reached",
                 str(hit["step"]) if hit else "-", f"{max(e['val_reward'] for e in r['evals']):.3f}",
                 f"{r['evals'][-1]['val_reward']:.3f}", f"{r['step_s']:.3f}",
                 f"{np.mean(r['blocking']):.3f}" if r["blocking"] else "-")
        print("| " + " | ".join(cells) + " |")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "bench.json").write_text(json.dumps(
        {m: {k: v for k, v in r.items() if k != "evals"} | {"val": [e["val_reward"] for e in r["evals"]]}
         for m, r in results.items()}, indent=2, default=float))


if __name__ == "__main__":
    main()
