"""Replay the live forecast over finished runs: what it would have said at each eval, and what --stop-if-worse
would have saved.

    python -m benchmarks.forecast_replay RUN_DIR [RUN_DIR ...] [--baseline RUN_DIR] [--stop-if-worse 0.9]

For each run, the forecast is refitted on its first 5, 6, ... evals exactly as during the run (the same
Forecaster, warm-started, on a copy of metrics.jsonl cut after each eval), and the table says from which fraction
of the run's compute on every forecast's 90 % interval of the final reward held the observed final value. With
--baseline, each forecast is compared with the baseline run (all its evals) and the first forecast at which
P(A < A_baseline) >= --stop-if-worse would have stopped the run: the compute after it is what the stop saves.
Prints one table; --json FILE writes the rows. The refits use the live forecast's NUTS settings (ForecastConfig) and
are timed in wall and CPU seconds; run it as the refit process runs (``XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1"``, one thread) to time what a run's refits cost.

    python -m benchmarks.forecast_replay --check-warm RUN_DIR [RUN_DIR ...] --compute-key flops

checks the cheap refits (each starting from the previous refit's adapted step sizes and mass matrices with a
short warm-up, ForecastConfig.warm_warmup) against full NUTS refits on the same evals, beside the difference two
full refits with different seeds show.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from scalerl_jax.config import ForecastConfig
from scalerl_jax.scaling.forecast import Forecaster, StopRule, forecast_history, stop_reason


def replay(run_dir: Path, *, baseline: Path | None, stop_if_worse: float | None, min_evals: int = 5,
           stop_min_evals: int = 6, confirmations: int = 2, compute_key: str = "device_hours", seed: int = 0,
           **nuts) -> dict:
    lines = [line for line in open(run_dir / "metrics.jsonl") if line.strip()]
    rows = [json.loads(line) for line in lines]
    evals = [i for i, r in enumerate(rows) if r.get("kind") == "eval" and r.get(compute_key) is not None]
    last = rows[evals[-1]]
    total_steps = int(last["step"])
    forecasts, stop, cpu = [], None, []
    rule = StopRule(stop_if_worse, stop_min_evals, confirmations)  # the trainer's rule
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ForecastConfig()  # the live forecast's own NUTS settings unless given
        nuts = {"num_samples": cfg.num_samples, "num_chains": cfg.num_chains, "num_warmup": cfg.num_warmup,
                "warm_warmup": cfg.warm_warmup, **nuts}
        fc = Forecaster(tmp, compute_key=compute_key, min_evals=min_evals, baseline=baseline, seed=seed, **nuts)
        fc.warm_up()  # compiled before the first refit, as the refit process does
        for n, i in enumerate(evals, start=1):
            if n < min_evals:
                continue
            (Path(tmp) / "metrics.jsonl").write_text("".join(lines[: i + 1]))
            cpu0 = time.process_time()
            row = fc.refit(total_steps=total_steps)
            cpu.append(time.process_time() - cpu0)
            forecasts.append(row)
            if rule.update(row)[0] is not None and stop is None:
                stop = row
    h = forecast_history(forecasts, last[compute_key], last["val_reward"])
    out = {"run": str(run_dir), "evals": len(evals), "forecasts": len(forecasts), "final_reward": last["val_reward"],
           "final_compute": last[compute_key], "held_from_fraction": h["held_from_fraction"] if h else None,
           "last_A": [forecasts[-1][k] for k in ("A_mean", "A_lo", "A_hi")] if forecasts else None,
           "seconds": time.perf_counter() - t0,
           "refit_seconds": [float(np.median([r["fit_seconds"] for r in forecasts])),
                             float(np.max([r["fit_seconds"] for r in forecasts]))] if forecasts else None,
           "refit_cpu_seconds": [float(np.median(cpu)), float(np.max(cpu))] if cpu else None,
           "forecast_rows": forecasts}
    if baseline is not None:
        out["stopped_at_step"] = stop["step"] if stop else None
        out["compute_saved_fraction"] = (1 - stop["compute"] / last[compute_key]) if stop else 0.0
        out["last_P_A_gt_baseline"] = forecasts[-1].get("P_A_gt_baseline") if forecasts else None
        # the decision "became true" at the first forecast from which every later one meets the rule; the stop fires
        # this many evals after it (the confirmations' cost)
        meets = [stop_reason(r, stop_if_worse, stop_min_evals) is not None for r in forecasts]
        true_from = next((i for i in range(len(meets)) if all(meets[i:])), None)
        out["true_from_step"] = forecasts[true_from]["step"] if true_from is not None else None
        out["evals_to_fire"] = (forecasts.index(stop) - true_from) if stop is not None and true_from is not None \
            else None
    return out


AGREE_KEYS = (("A_lo", "A_hi"), ("R_obs_lo", "R_obs_hi"))


def disagreement(rows: list[dict], ref: list[dict]) -> list[float]:
    """For each pair of forecasts of the same eval: how far apart the two fits' 90 % intervals of A and of the final
    eval are, the largest of the four end-point differences in units of the reference interval's width."""
    out = []
    for r, q in zip(rows, ref, strict=True):
        assert r["step"] == q["step"]
        out.append(max(abs(r[k] - q[k]) / max(q[hi] - q[lo], 1e-9) for lo, hi in AGREE_KEYS for k in (lo, hi)))
    return out


def check_warm(run_dirs: list[Path], compute_key: str) -> list[dict]:
    """The warm refits (ForecastConfig.warm_warmup) against full refits (every refit adapted from scratch) on the
    same evals, and two full replays with different seeds against each other: the Monte Carlo difference any two
    NUTS fits show, the scale the warm refits' difference is read against."""
    out = []
    for d in run_dirs:
        warm = replay(d, baseline=None, stop_if_worse=None, compute_key=compute_key)
        full = replay(d, baseline=None, stop_if_worse=None, compute_key=compute_key, warm_warmup=0)
        full2 = replay(d, baseline=None, stop_if_worse=None, compute_key=compute_key, warm_warmup=0, seed=100)
        w, f, f2 = (x["forecast_rows"] for x in (warm, full, full2))
        dw, df = disagreement(w, f), disagreement(f2, f)
        out.append({"run": str(d), "forecasts": len(f), "cpu_warm": warm["refit_cpu_seconds"][0],
                    "cpu_full": full["refit_cpu_seconds"][0],
                    "warm_vs_full": [float(np.median(dw)), float(np.quantile(dw, 0.9))],
                    "full_vs_full": [float(np.median(df)), float(np.quantile(df, 0.9))],
                    "warm_adapted": sum(bool(r.get("warm_adaptation")) for r in w),
                    "divergences": [sum(r["divergences"] for r in x) for x in (w, f)]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.forecast_replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+", type=Path)
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--stop-if-worse", type=float, default=0.9)
    ap.add_argument("--confirmations", type=int, default=2, help="consecutive forecasts the stop rule needs")
    ap.add_argument("--compute-key", default="device_hours", choices=("device_hours", "flops"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--check-warm", action="store_true", help="compare the warm refits with full refits (and two "
                    "full replays with each other) on each run: CPU seconds per refit and how far the intervals move")
    a = ap.parse_args(argv)
    if a.check_warm:
        res = check_warm(a.run_dirs, a.compute_key)
        print("| run | forecasts | refit CPU s warm / full | warm vs full: interval ends moved (median, 90th pct, "
              "x width) | full vs full, another seed | warm-adapted refits | divergences warm / full |")
        print("|---|---|---|---|---|---|---|")
        for r in res:
            print(f"| {r['run']} | {r['forecasts']} | {r['cpu_warm']:.2f} / {r['cpu_full']:.2f} | "
                  f"{r['warm_vs_full'][0]:.2f}, {r['warm_vs_full'][1]:.2f} | {r['full_vs_full'][0]:.2f}, "
                  f"{r['full_vs_full'][1]:.2f} | {r['warm_adapted']} | {r['divergences'][0]} / {r['divergences'][1]} |")
        if a.json:
            a.json.write_text(json.dumps(res, indent=2))
        return 0
    results = [replay(d, baseline=a.baseline, stop_if_worse=a.stop_if_worse if a.baseline else None,
                      confirmations=a.confirmations, compute_key=a.compute_key) for d in a.run_dirs]
    print("| run | evals | forecasts | refit s (median, max; CPU s) | final reward | every interval held it from | "
          "last A [90 %] |" + (" worse from step | stopped at step | evals after | compute saved | "
                               "last P(A > A_base) |" if a.baseline else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|---|---|---|" if a.baseline else ""))
    for r in results:
        held = "never" if r["held_from_fraction"] is None else f"{r['held_from_fraction']:.0%} of compute"
        a_txt = "-" if r["last_A"] is None else f"{r['last_A'][0]:.3f} [{r['last_A'][1]:.3f}, {r['last_A'][2]:.3f}]"
        secs = "-" if r["refit_seconds"] is None else (
            f"{r['refit_seconds'][0]:.2f}, {r['refit_seconds'][1]:.2f} ({r['refit_cpu_seconds'][0]:.2f}, "
            f"{r['refit_cpu_seconds'][1]:.2f} CPU)")
        line = (f"| {r['run']} | {r['evals']} | {r['forecasts']} | {secs} | {r['final_reward']:.3f} | {held} | "
                f"{a_txt} |")
        if a.baseline:
            p = r["last_P_A_gt_baseline"]
            dash = lambda x: "-" if x is None else x  # noqa: E731
            line += (f" {dash(r['true_from_step'])} | "
                     f"{r['stopped_at_step'] if r['stopped_at_step'] is not None else 'not stopped'} | "
                     f"{dash(r['evals_to_fire'])} | {r['compute_saved_fraction']:.0%} | "
                     f"{'-' if p is None else f'{p:.3f}'} |")
        print(line)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
