"""Where an RL step's time goes, per preset, beside the step's compute floor.

Runs a few RL steps of each preset on its own path (``experiments.run_path.run_experiment``: the preset's base
model or warm start, generators, trainer; no fit) and reads the train rows it wrote (docs/METRICS.md): per step,
the trainer's wall time (``loop_seconds``) split into waiting for the batch (``wait_seconds``: generation the
trainer did not overlap), batch assembly, the train step, the weight hand-over, and the rest (metrics,
checkpoints, evals); the producer's side (generation, scoring) beside it; the cost of one eval and its share per
step at the preset's ``eval_every``. The compute floor is the step's counted FLOPs (training 3x forward on the
real tokens + generation forward, the ``flops`` columns) over this machine's matmul rate measured in the same
process (a jitted float32 matmul); ``x floor`` is the step's wall time over it. Each preset's line also gives the
invocation's page faults and kernel CPU seconds per RL step (glibc's huge pages change them: scalerl_jax/hostmem.py;
``SCALERL_HUGEPAGES=0`` measures without).

    .venv/bin/python -m benchmarks.bench_loop                        # tiny, small, tiny_chain; 12 steps each
    .venv/bin/python -m benchmarks.bench_loop --presets tiny --steps 24 --set train.eval_every=8

The first ``--skip`` steps (compilation) are reported apart. A preset's warm start is trained once into
``--out/warmstart_<preset>`` and reused by later invocations (the key of experiments.base_models.warm_start_key).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import time
from pathlib import Path

import numpy as np
from scalerl_jax.benchmarks import machine

from scalerl_jax import hostmem


def breakdown(rows: list[dict], skip: int, eval_every: int) -> dict:
    """Per-step means of the train rows after the first ``skip`` (and the first steps apart); one eval's cost."""
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    steady = train[skip:] or train
    mean = lambda k, rs=steady: float(np.mean([r.get(k, 0.0) for r in rs])) if rs else float("nan")  # noqa: E731
    parts = {k: mean(k) for k in ("loop_seconds", "wait_seconds", "batch_seconds", "step_seconds",
                                  "weight_sync_seconds", "gen_seconds", "score_seconds")}
    # the row after an eval carries that eval in its loop_seconds (the step-0 eval runs before the loop starts)
    eval_in_loop = sum(e["eval_seconds"] for e in evals
                       if e["step"] > 0 and any(e["step"] == r["step"] - 1 for r in steady))
    parts["eval_in_loop"] = eval_in_loop / max(len(steady), 1)
    accounted = sum(parts[k] for k in ("wait_seconds", "batch_seconds", "step_seconds", "weight_sync_seconds",
                                       "eval_in_loop"))
    parts["other"] = parts["loop_seconds"] - accounted
    flops = [r["flops"] for r in train]
    per_step_flops = float(np.mean(np.diff(flops[skip - 1 if skip else 0:]))) if len(flops) > 1 else flops[0]
    one_eval = float(np.median([e["eval_seconds"] for e in evals])) if evals else float("nan")
    return {"steps": len(train), "steady_steps": len(steady), "first_steps_s": [r["loop_seconds"] for r in
                                                                                train[:skip]],
            **parts, **spread(steady), "flops_per_step": per_step_flops, "eval_seconds": one_eval,
            "eval_per_step": one_eval / max(eval_every, 1), "completion_len": mean("completion_len"),
            "train_rows": mean("train_rows")}


def cv(xs: list[float]) -> float:
    """Coefficient of variation (population sd / mean); nan for fewer than two values."""
    return float(np.std(xs) / np.mean(xs)) if len(xs) > 1 and np.mean(xs) > 0 else float("nan")


def spread(train: list[dict]) -> dict:
    """How steady the steps are: the coefficient of variation of the trainer's step (``loop_cv``), of the train
    step's seconds per trained row (``per_row_cv``: a compacted batch trains fewer rows and is meant to take less
    time) and, among steps that trained the same number of rows, the steps' CV pooled over the row counts that
    occur at least three times (``same_rows_cv``, weighted by their step counts)."""
    by_rows: dict[int, list[float]] = {}
    for r in train:
        by_rows.setdefault(int(r.get("train_rows", 0)), []).append(r["step_seconds"])
    groups = [v for v in by_rows.values() if len(v) >= 3]
    pooled = (sum(len(v) * cv(v) for v in groups) / sum(len(v) for v in groups)) if groups else float("nan")
    return {"loop_cv": cv([r["loop_seconds"] for r in train]),
            "per_row_cv": cv([r["step_seconds"] / r["train_rows"] for r in train if r.get("train_rows")]),
            "same_rows_cv": pooled, "same_rows_steps": sum(len(v) for v in groups)}


def spread_line(r: dict) -> str:
    """The spread of :func:`spread` in words."""
    return (f"step-time CV {r['loop_cv']:.0%}, per trained row {r['per_row_cv']:.0%}, at equal rows "
            f"{r['same_rows_cv']:.0%} ({r['same_rows_steps']} steps)")


def run_preset(preset: str, steps: int, out: Path, sets: list[str]) -> tuple[list[dict], int]:
    """Run ``steps`` RL steps of ``preset`` into ``out/<preset>`` (parsed as ``python -m experiments.math_8b
    --preset PRESET --steps STEPS --set ...`` would be); its metrics rows and its eval_every."""
    from scalerl_jax.experiments.cli import apply_run_flags, parse_run_args
    from scalerl_jax.experiments.run_path import run_experiment

    argv = ["--preset", preset, "--steps", str(steps), *[x for kv in sets for x in ("--set", kv)]]
    from scalerl_jax.experiments.presets import PRESETS

    args, plan = parse_run_args(argv, preset, "scalerl", 0, presets=PRESETS, prog="benchmarks.bench_loop", doc=None)
    plan = apply_run_flags(plan, args, "benchmarks.bench_loop")
    plan = dataclasses.replace(plan, exp=dataclasses.replace(plan.exp, out_dir=str(out / preset)))
    run_experiment(plan, fit=False, overwrite=True, warm_dir=out / f"warmstart_{preset}",
                   log=lambda s: print(f"  {s}", flush=True) if s.startswith(("[warm", "[rl]")) else None)
    rows = [json.loads(line) for line in (out / preset / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, plan.exp.train.eval_every


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small", "tiny_chain"])
    ap.add_argument("--steps", type=int, default=12, help="RL steps per preset")
    ap.add_argument("--skip", type=int, default=2, help="first steps reported apart (compilation)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="config override for every preset, as experiments.math_8b --set")
    ap.add_argument("--out", default="runs/bench_loop", help="run directories and the shared warm starts")
    ap.add_argument("--json", default=None, help="also write the table's numbers to this file")
    a = ap.parse_args(argv)
    if a.steps <= a.skip:
        ap.error(f"--steps ({a.steps}) must exceed --skip ({a.skip})")
    out = Path(a.out)
    results = {}
    for preset in a.presets:
        print(f"[bench_loop] {preset}: {a.steps} RL steps", flush=True)
        t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        rows, eval_every = run_preset(preset, a.steps, out, a.set)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        # the whole invocation's page faults and kernel CPU time per RL step (warm start, compiles and evals too):
        # what glibc's huge-page tunable changes (scalerl_jax/hostmem.py)
        results[preset] = {**breakdown(rows, a.skip, eval_every), "run_seconds": time.perf_counter() - t0,
                           "eval_every": eval_every, "minor_faults_per_step": (ru1.ru_minflt - ru0.ru_minflt) / a.steps,
                           "kernel_cpu_s_per_step": (ru1.ru_stime - ru0.ru_stime) / a.steps}
    rate = machine.matmul_flops_per_s()
    facts = machine.describe(matmul=False)
    print("\n" + machine.header(facts))
    print(f"host: {hostmem.describe()}")
    print(f"matmul rate (float32, 1024^3, best of 20): {rate / 1e9:.1f} GFLOP/s")
    cols = ("wait_seconds", "batch_seconds", "step_seconds", "weight_sync_seconds", "eval_in_loop", "other")
    print(f"\n{'preset':<11} {'s/step':>7} " + " ".join(f"{c.split('_')[0]:>7}" for c in cols)
          + f" {'gen':>7} {'score':>7} {'eval/st':>7} {'floor s':>8} {'x floor':>8} {'len':>5} {'rows':>5}")
    for preset, r in results.items():
        floor = r["flops_per_step"] / rate
        r["floor_seconds"], r["x_floor"] = floor, r["loop_seconds"] / max(floor, 1e-12)
        shares = " ".join(f"{r[c] / r['loop_seconds']:>6.0%} " for c in cols)
        print(f"{preset:<11} {r['loop_seconds']:>7.3f} {shares}{r['gen_seconds']:>7.3f} {r['score_seconds']:>7.3f} "
              f"{r['eval_per_step']:>7.3f} {floor:>8.4f} {r['x_floor']:>8.0f} {r['completion_len']:>5.1f} "
              f"{r['train_rows']:>5.0f}")
    print("\ns/step: trainer wall time per steady step (loop_seconds); the next six columns are its shares: waiting "
          "for the batch, assembling it, the train step, the weight hand-over, an eval inside the step, the rest. "
          "gen, score: the producer's seconds per batch (overlapped with training in pipeline mode). eval/st: one "
          "eval's seconds / eval_every. floor s: counted FLOPs per step / the matmul rate. rows: the train batch's "
          "mean row count (filtered groups left out, TrainConfig.row_buckets).")
    for preset, r in results.items():
        print(f"{preset}: first {len(r['first_steps_s'])} steps {', '.join(f'{s:.2f}' for s in r['first_steps_s'])} s"
              f" (compilation); one eval {r['eval_seconds']:.2f} s; whole invocation {r['run_seconds']:.0f} s, "
              f"{r['minor_faults_per_step']:,.0f} page faults and {r['kernel_cpu_s_per_step']:.2f} s of kernel CPU "
              f"per step; {spread_line(r)}")
    if a.json:
        Path(a.json).write_text(json.dumps({"matmul_flops_per_s": rate, "host": hostmem.describe(), "machine": facts,
                                            "presets": results}, indent=2))


if __name__ == "__main__":
    main()
