"""One command for one GPU: a whole ScaleRL run of the tiny recipe's task on a Llama-3.2-1B-shaped model, phase by
phase, inside a wall budget, with the numbers that say where its time and memory go.

    bash benchmarks/gpu_rl.sh --out gpu_rl.json               # one GPU, --budget-s 300 by default
    bash benchmarks/gpu_rl.sh --cpu-smoke --out x.json        # the same phases, tiny model, on the CPU

The run is the users' run path (``experiments.run_path``) on the ``gpu_rl`` preset (``experiments/presets.py``:
the tiny task, ``llama3_1b``'s shapes, random init, the embedded engine on the trainer's device); ``--cpu-smoke``
swaps in the ``tiny`` model and fewer steps (:func:`smoke_plan`). Phases, in order, each in its own process with
its own timeout (``gpu_check_driver.run_child``: the process group is killed at the timeout) and the JSON (``--out``)
rewritten after each:

1. ``setup``: backend, device kind, memory limit, the peak FLOP/s MFU is computed against (the GPU check's datasheet
   table, ``gpu_check.PEAK_BF16``, else a measured matmul: ``gpu_check.device_peak``).
2. ``aot``: the train step of this configuration compiled ahead of time for one device
   (``scalerl_jax.aot.aot_compile``, what ``--dry-run`` runs): its predicted per-device peak and the train state's
   initialisation peak.
3. ``warm_start``: the preset's supervised warm start (``run_path.prepare_base``; never taken from the warm-start
   cache, ``SCALERL_WARMSTART_CACHE=0``): steps, loss, seconds, tokens/s.
4. ``rl``: ``run_path.run_experiment`` without the fit, from that warm start: the RL step's breakdown
   (``bench_loop.breakdown``: waiting for generation, batch, train step, weight hand-over, evals, the rest; the
   producer's generation and scoring seconds), the train step's tokens/s (rows x row length per second of
   ``step_seconds``) and MFU (the trainer's counted training FLOPs, ``flops_train``, per second of
   ``step_seconds``, over the peak), generated tokens/s, the device's peak bytes in use against the AOT
   prediction, the validation reward's first, last and best.
5. ``fit``: the sigmoid law fitted on the first half of the run's compute and report.md, as the run path does after
   its last step (``scaling.report.fit_runs``, ``experiments.report.write_report``).

A phase starts only if its minimum fits in what is left of ``--budget-s`` (else it is reported as skipped); its
timeout is what is left minus the minimums of the phases after it. A phase whose input is missing (a failed warm
start) is skipped with the reason. Exit status 0 only when every phase ran and succeeded. Not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from scalerl_jax.benchmarks.gpu_check_driver import Stopped, child_env, run_child, show_tail, tail_line
from scalerl_jax.benchmarks.gpu_check_report import Budget

PHASES = ("setup", "aot", "warm_start", "rl", "fit")
# seconds a phase needs to be started, and the most it may take: on one GPU (compilation included) and in the CPU
# smoke run (a loaded 2-core machine)
MIN_S = {"gpu": {"setup": 15.0, "aot": 25.0, "warm_start": 50.0, "rl": 80.0, "fit": 25.0},
         "cpu": {"setup": 10.0, "aot": 10.0, "warm_start": 20.0, "rl": 40.0, "fit": 20.0}}
MAX_S = {"gpu": {"setup": 60.0, "aot": 90.0, "warm_start": 150.0, "rl": 240.0, "fit": 120.0},
         "cpu": {"setup": 120.0, "aot": 300.0, "warm_start": 1200.0, "rl": 1200.0, "fit": 600.0}}
# the phases each phase reads the outputs of
NEEDS = {"rl": ("warm_start",), "fit": ("rl",)}
SKIP_STEPS = 2  # the first RL steps (compilation) are left out of the per-step numbers
FIT_SAMPLES = {"gpu": 1000, "cpu": 300}  # NUTS draws per chain of the final fit (the run path's: 1000)
# the default budget: with ``gpu_check.sh --quick`` (gpu_check.QUICK_BUDGET_S) inside one 10-minute GPU slot
DEFAULT_BUDGET_S = 300.0


# ---- the plan ---------------------------------------------------------------------------------------------


def smoke_plan(seed: int = 0):
    """The ``gpu_rl`` preset at CPU sizes: the ``tiny`` model on the same task, a warm start of 300 x 64 rows at the
    tiny preset's rate, 20 RL steps of 16 prompts x 8 at lr 2e-4 (4x tiny's: the rise has 20 steps to show), an
    eval every 2 steps on 64 prompts x 4 (the first-half fit needs 5 evals in the first half of the FLOPs)."""
    from scalerl_jax.experiments.presets import gpu_rl_plan, tiny_plan

    from scalerl_jax.models.presets import tiny

    R = dataclasses.replace
    p, t = gpu_rl_plan(seed), tiny_plan(seed)
    exp = R(p.exp, name="scalerl_gpu_rl_smoke", model=tiny(),
            rollout=R(p.exp.rollout, prompts_per_batch=16),
            data=R(p.exp.data, val_size=64),
            train=R(p.exp.train, lr=2e-4, steps=20, eval_every=2, checkpoint_every=20))
    return R(p, exp=exp, real=False, warm_steps=300, warm_batch=64, warm_lr=t.warm_lr, warm_warmup=t.warm_warmup)


def plan_for(gpu: bool, seed: int, work: Path):
    from scalerl_jax.experiments.presets import gpu_rl_plan

    plan = gpu_rl_plan(seed) if gpu else smoke_plan(seed)
    return dataclasses.replace(plan, exp=dataclasses.replace(plan.exp, out_dir=str(work / "run")))


def plan_meta(plan) -> dict:
    exp = plan.exp
    return {"name": exp.name, "model_params": exp.model.num_params(), "d_model": exp.model.d_model,
            "n_layers": exp.model.n_layers, "vocab_size": exp.model.vocab_size, "warm_steps": plan.warm_steps,
            "warm_batch": plan.warm_batch, "rl_steps": exp.train.steps, "eval_every": exp.train.eval_every,
            "rows_per_step": exp.rollout.prompts_per_batch * exp.rollout.group_size, "seq_len": plan.seq_len,
            "lr": exp.train.lr, "engine": exp.rollout.engine, "generator_dtype": exp.rollout.generator_dtype}


# ---- the phases (each runs in a process of its own) ---------------------------------------------------------


def phase_setup(gpu: bool, plan, prior: dict) -> dict:
    import jax
    from scalerl_jax.benchmarks.gpu_check import device_peak
    from scalerl_jax.benchmarks.gpu_check_report import GPU, SMOKE, Report

    rep = Report()
    peak = device_peak(rep, GPU if gpu else SMOKE, gpu)
    source = rep.meta["peak_source"]
    if not gpu:  # a CPU's rate at the smoke's 128^3 is far below what the train step reaches: take bench_loop's
        from scalerl_jax.benchmarks.machine import matmul_flops_per_s

        peak, source = matmul_flops_per_s(), "measured float32 1024^3 matmul, best of 20 (CPU)"
    stats = jax.devices()[0].memory_stats() or {}
    return {"backend": rep.meta["backend"], "device_kind": rep.meta["device_kind"],
            "n_devices": rep.meta["n_devices"], "jax_version": rep.meta["jax_version"], "peak_flops": peak,
            "peak_source": source, "matmul_flops_per_s": rep.rows[0]["value"] * 1e12,
            "memory_limit_bytes": stats.get("bytes_limit")}


def phase_aot(gpu: bool, plan, prior: dict) -> dict:
    from scalerl_jax.aot import aot_compile
    from scalerl_jax.config import MeshConfig

    exp = plan.exp
    cfg = dataclasses.replace(exp.model, max_seq_len=max(exp.model.max_seq_len, plan.seq_len))
    rows = exp.rollout.prompts_per_batch * exp.rollout.group_size
    limit = prior.get("setup", {}).get("memory_limit_bytes")
    r = aot_compile(cfg, 1, seq_len=plan.seq_len, mesh_cfg=MeshConfig(data=1, fsdp=-1), loss_cfg=exp.loss,
                    train_cfg=exp.train, microbatches=exp.train.microbatches,
                    seqs_per_shard=rows // exp.train.microbatches, temperature=exp.rollout.temperature,
                    **({"device_memory_gb": limit / 1e9} if limit else {}))
    return {"step_peak_bytes": int(r["peak_bytes"]), "init_peak_bytes": int(r["init_peak_bytes"]),
            "params_bytes": int(r["params_bytes"]), "opt_state_bytes": int(r["opt_state_bytes"]),
            "temp_bytes": int(r["temp_bytes"]), "global_batch": int(r["global_batch"]), "seq_len": plan.seq_len,
            "compile_s": float(r["compile_s"])}


def phase_warm_start(gpu: bool, plan, prior: dict) -> dict:
    from scalerl_jax.experiments.base_models import prepare_base

    run_dir, warm = Path(plan.exp.out_dir), Path(plan.exp.out_dir).parent / "warmstart"
    for d in (run_dir, warm):  # a fresh run every time: the warm start is measured, never reused
        shutil.rmtree(d, ignore_errors=True)
    run_dir.mkdir(parents=True)
    base = prepare_base(plan, run_dir, warm_dir=warm, log=print)
    rows = [json.loads(line) for line in (run_dir / "warmstart.jsonl").read_text().splitlines() if line.strip()]
    tokens = plan.warm_steps * plan.warm_batch * plan.warm_seq_len
    return {"steps": plan.warm_steps, "batch": plan.warm_batch, "seq_len": plan.warm_seq_len,
            "seconds": base.seconds, "train_seconds": rows[-1]["seconds"], "loss_first": rows[0]["loss"],
            "loss_last": rows[-1]["loss"], "tokens_per_s": tokens / rows[-1]["seconds"], "dir": str(base.dir)}


def rl_numbers(rows: list[dict], *, eval_every: int, seq_len: int, peak_flops: float | None,
               skip: int = SKIP_STEPS) -> dict:
    """The RL phase's numbers from the run's metrics rows: the steps after the first ``skip`` (compilation)."""
    from scalerl_jax.benchmarks.bench_loop import breakdown

    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if len(train) <= skip or not evals:
        raise RuntimeError(f"{len(train)} train rows and {len(evals)} evals: too few to measure (need > {skip})")
    steady, before = train[skip:], train[skip - 1:-1] if skip else [{"flops_train": 0.0}] + train[:-1]
    step_s = sum(r["step_seconds"] for r in steady)
    train_flops = sum(r["flops_train"] - b["flops_train"] for r, b in zip(steady, before))
    train_tokens = sum(r["train_rows"] * seq_len for r in steady)
    gen_s = sum(r["gen_seconds"] for r in steady)
    gen_tokens = sum(r["gen_tokens_per_s"] * r["gen_seconds"] for r in steady)
    rewards = [r["val_reward"] for r in evals]
    return {"steps": len(train), "steady_steps": len(steady),
            "breakdown": breakdown(rows, skip, eval_every),
            "train_step_seconds": step_s, "train_flops": train_flops, "train_tokens": train_tokens,
            "train_tokens_per_s": train_tokens / step_s, "train_flops_per_s": train_flops / step_s,
            "mfu": train_flops / step_s / peak_flops if peak_flops else None,
            "gen_seconds": gen_s, "gen_tokens": gen_tokens, "gen_tokens_per_s": gen_tokens / gen_s if gen_s else 0.0,
            "val_steps": [r["step"] for r in evals], "val_rewards": rewards, "val_reward_first": rewards[0],
            "val_reward_last": rewards[-1], "val_reward_best": max(rewards),
            "val_reward_rise": rewards[-1] - rewards[0]}


def phase_rl(gpu: bool, plan, prior: dict) -> dict:
    import jax
    from scalerl_jax.experiments.run_path import run_experiment

    run_dir = Path(plan.exp.out_dir)
    t0 = time.perf_counter()
    summary = run_experiment(plan, fit=False, overwrite=True, warm_dir=run_dir.parent / "warmstart", log=print)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = rl_numbers(rows, eval_every=plan.exp.train.eval_every, seq_len=plan.seq_len,
                     peak_flops=prior.get("setup", {}).get("peak_flops"))
    stats = jax.devices()[0].memory_stats()
    peak_b = None if not stats else stats.get("peak_bytes_in_use")
    aot = prior.get("aot", {}).get("step_peak_bytes")
    out.update(run_seconds=wall, rl_wall_seconds=summary["wall_seconds"], seq_len=plan.seq_len,
               device_peak_bytes=peak_b,
               device_peak_reason=None if peak_b is not None else
               f"{jax.devices()[0].platform} device reports no memory_stats()",
               aot_step_peak_bytes=aot, device_peak_over_aot=peak_b / aot if peak_b and aot else None)
    return out


def phase_fit(gpu: bool, plan, prior: dict) -> dict:
    """The run path's fit and report after the last step (experiments/run_path.py, ``_train_and_report``)."""
    from scalerl_jax.experiments.report import write_report

    from scalerl_jax.scaling.report import fit_runs

    run_dir = Path(plan.exp.out_dir)
    both = json.loads((run_dir / "summary.json").read_text())
    fit = fit_runs([run_dir], run_dir / "fit", fit_until=0.5, num_samples=FIT_SAMPLES["gpu" if gpu else "cpu"],
                   num_chains=4, compute_key=plan.exp.forecast.compute_key)
    both["fit"] = fit
    (run_dir / "summary.json").write_text(json.dumps(both, indent=2, default=float))
    write_report(run_dir, plan, both["run"], fit)
    e = next(iter(fit["runs"].values()))
    b = e["bayes"]["summary"] if "summary" in e["bayes"] else e["bayes"]
    held = e.get("held_out", {})
    return {"n_fit": int(e["n_fit"]), "compute_key": plan.exp.forecast.compute_key,
            "A_mean": b["A"]["mean"], "A_lo": b["A"]["lo"], "A_hi": b["A"]["hi"],
            "predicted_end": e["prediction"]["mean"], "predicted_end_lo": e["prediction"]["lo"],
            "predicted_end_hi": e["prediction"]["hi"], "observed_end": held.get("observed_nearest_target"),
            "report_md": str(run_dir / "report.md")}


PHASE_FNS = {"setup": phase_setup, "aot": phase_aot, "warm_start": phase_warm_start, "rl": phase_rl,
             "fit": phase_fit}


def run_phase(phase: str, gpu: bool, seed: int, work: Path, prior: dict, out: Path) -> int:
    """One phase in this process: its numbers (or its error) to ``out``."""
    import traceback

    from scalerl_jax.compile_cache import use_compile_cache

    use_compile_cache(log=print)  # every phase: a second run loads its programs instead of compiling them
    plan = plan_for(gpu, seed, work)
    try:
        got, code = {"status": "ok", **PHASE_FNS[phase](gpu, plan, prior)}, 0
    except Exception as e:  # noqa: BLE001 - the phase's failure is its row
        traceback.print_exc()
        got, code = {"status": "error", "detail": f"{type(e).__name__}: {e}"[:400]}, 1
    out.write_text(json.dumps(got, default=float))
    return code


# ---- the driver (imports no JAX) ---------------------------------------------------------------------------


def _write(doc: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float))
    os.replace(tmp, out)


def _on_signal(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def run_all(gpu: bool, budget_s: float, out: Path, work: Path, seed: int = 0) -> dict:
    """Every phase in order, each in its own process; ``out`` rewritten after each one."""
    mode = "gpu" if gpu else "cpu"
    budget = Budget(budget_s)
    doc = {"meta": {"mode": "gpu" if gpu else "cpu-smoke", "budget_s": budget_s, "seed": seed, "work": str(work),
                    "python": sys.version.split()[0], "finished": False}, "phases": {}}
    env = child_env(gpu)
    env["SCALERL_WARMSTART_CACHE"] = "0"  # the warm start is measured: never copied from an earlier run's
    if gpu:
        env.pop("JAX_PLATFORMS", None)
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    _write(doc, out)
    try:
        for i, phase in enumerate(PHASES):
            print(f"== {phase}", flush=True)
            left = budget.left()
            missing = [n for n in NEEDS.get(phase, ()) if doc["phases"].get(n, {}).get("status") != "ok"]
            if missing or left < MIN_S[mode][phase]:
                why = (f"{', '.join(missing)} did not succeed" if missing else
                       f"{left:.0f} s left of the budget, {MIN_S[mode][phase]:.0f} s needed")
                doc["phases"][phase] = {"status": "skipped", "wall_s": 0.0, "detail": f"skipped: {why}"}
                print(f"  skipped: {why}", flush=True)
                _write(doc, out)
                continue
            reserve = sum(MIN_S[mode][p] for p in PHASES[i + 1:])
            timeout = min(MAX_S[mode][phase], max(MIN_S[mode][phase], left - reserve))
            phase_out = work / f"phase_{phase}.json"
            phase_out.unlink(missing_ok=True)
            prior = work / "prior.json"
            prior.write_text(json.dumps({k: v for k, v in doc["phases"].items() if v.get("status") == "ok"}))
            cmd = [sys.executable, "-m", "scalerl_jax.benchmarks.gpu_rl", "--phase", phase, "--phase-out",
                   str(phase_out), "--prior", str(prior), "--work", str(work), "--seed", str(seed)]
            cmd += [] if gpu else ["--cpu-smoke"]
            res = None
            try:
                res = run_child(cmd, env, timeout, capture_stdout=False)
            finally:
                got = json.loads(phase_out.read_text()) if phase_out.exists() else {}
                if res is None:
                    got = {"status": "error", "detail": "stopped from outside while it ran"}
                elif res.returncode is None:
                    got = {**got, "status": "error", "detail": f"timeout: killed after {res.wall_s:.0f} s "
                           f"(limit {timeout:.0f} s)"}
                elif not got:
                    show_tail(f"phase {phase}", res.stderr_tail)
                    got = {"status": "error", "detail": f"exit {res.returncode}: {tail_line(res.stderr_tail)}"}
                elif got["status"] == "error":
                    show_tail(f"phase {phase}", res.stderr_tail)
                got["wall_s"] = round(res.wall_s if res is not None else 0.0, 2)
                got["timeout_s"] = round(timeout, 1)
                doc["phases"][phase] = got
                _write(doc, out)
            print(f"  {phase}: {got['status']} in {got['wall_s']:.1f} s {got.get('detail', '')}".rstrip(), flush=True)
        doc["meta"]["finished"] = True
    except Stopped:
        pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        doc["meta"]["wall_s"] = budget_s - budget.left()
        _write(doc, out)
    return doc


def _g(x, scale=1.0, fmt=".3g") -> str:
    return "-" if x is None else format(x * scale, fmt)


def summary_lines(doc: dict) -> list[str]:
    """What the run printed at its end: one block per phase."""
    ph = doc["phases"]
    lines = [f"{'phase':<11} {'status':<8} {'wall s':>7}"]
    lines += [f"{p:<11} {ph[p]['status']:<8} {ph[p]['wall_s']:>7.1f}  {ph[p].get('detail', '')}".rstrip()
              for p in PHASES if p in ph]
    s, a, w, r, f = (ph.get(p, {}) for p in PHASES)
    if s.get("status") == "ok":
        lines.append(f"setup: {s['backend']} {s['device_kind']}; peak {s['peak_flops'] / 1e12:.4g} TFLOP/s "
                     f"({s['peak_source']})")
    if a.get("status") == "ok":
        lines.append(f"aot: train step peak {a['step_peak_bytes'] / 2**30:.2f} GiB, state init peak "
                     f"{a['init_peak_bytes'] / 2**30:.2f} GiB ({a['global_batch']} x {a['seq_len']} tokens)")
    if w.get("status") == "ok":
        lines.append(f"warm_start: {w['steps']} x {w['batch']} rows in {w['seconds']:.1f} s, loss "
                     f"{w['loss_first']:.3f} -> {w['loss_last']:.3f}, {w['tokens_per_s']:,.0f} tokens/s")
    if r.get("status") == "ok":
        b = r["breakdown"]
        lines.append(f"rl: {r['steps']} steps; per steady step {b['loop_seconds']:.3f} s = wait {b['wait_seconds']:.3f}"
                     f" + batch {b['batch_seconds']:.3f} + train step {b['step_seconds']:.3f} + hand-over "
                     f"{b['weight_sync_seconds']:.3f} + evals {b['eval_in_loop']:.3f} + other {b['other']:.3f}; "
                     f"generation {b['gen_seconds']:.3f} s, scoring {b['score_seconds']:.3f} s per batch")
        lines.append(f"rl: train step {r['train_tokens_per_s']:,.0f} tokens/s, MFU {_g(r['mfu'], 100, '.2f')} %; "
                     f"generated {r['gen_tokens_per_s']:,.0f} tokens/s; device peak "
                     f"{_g(r['device_peak_bytes'], 2**-30, '.2f')} GiB vs AOT step "
                     f"{_g(r['aot_step_peak_bytes'], 2**-30, '.2f')}"
                     f" GiB{'' if r['device_peak_bytes'] is not None else ' (' + r['device_peak_reason'] + ')'}")
        lines.append(f"rl: val reward {r['val_reward_first']:.3f} -> {r['val_reward_last']:.3f} (best "
                     f"{r['val_reward_best']:.3f}) over steps {r['val_steps'][0]}..{r['val_steps'][-1]}")
    if f.get("status") == "ok":
        lines.append(f"fit: A {f['A_mean']:.3f} [{f['A_lo']:.3f}, {f['A_hi']:.3f}] on {f['n_fit']} evals; predicted "
                     f"end {f['predicted_end']:.3f} [{f['predicted_end_lo']:.3f}, {f['predicted_end_hi']:.3f}], "
                     f"observed {_g(f['observed_end'])}; {f['report_md']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="the same phases on the CPU at tiny sizes")
    ap.add_argument("--out", default="gpu_rl.json", help="JSON, rewritten after every phase")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="wall budget for every phase "
                    "together, compilation included")
    ap.add_argument("--work", default=None, help="run directory (default runs/gpu_rl, runs/gpu_rl_smoke)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phase", choices=PHASES, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--phase-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--prior", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    gpu = not a.cpu_smoke
    work = Path(a.work or ("runs/gpu_rl" if gpu else "runs/gpu_rl_smoke")).resolve()
    if a.phase:
        prior = json.loads(Path(a.prior).read_text()) if a.prior else {}
        return run_phase(a.phase, gpu, a.seed, work, prior, Path(a.phase_out))
    work.mkdir(parents=True, exist_ok=True)
    doc = run_all(gpu, a.budget_s, Path(a.out), work, a.seed)
    print("\n" + "\n".join(summary_lines(doc)))
    print(f"\nwrote {a.out}; wall {doc['meta']['wall_s']:.0f} s of {a.budget_s:.0f}")
    ok = all(doc["phases"].get(p, {}).get("status") == "ok" for p in PHASES)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
