"""Leave-one-out ablations of ScaleRL (and the paper's baseline recipes), with one comparison report.

Launch::

    python -m experiments.loo --preset tiny                       # ScaleRL + every leave-one-out variant, seed 0
    python -m experiments.loo --preset tiny --seeds 3 --variants scalerl no_npr bf16_head
    python -m experiments.loo --preset smoke --variants scalerl ppo_off_policy --out runs/loo_smoke

Runs go one after another into ``<out>/<variant>_s<seed>``; a run whose summary.json exists is skipped, and a
run that was interrupted resumes from its checkpoint, so the command can simply be re-issued. At the end the
sigmoid law is fitted to every run on the first half of its compute and ``<out>/comparison/report.md``
tabulates A, B, C_mid with 90 % intervals, P(A_ScaleRL > A_variant), the overlaid curves and the ceiling
densities. Cost on a 2-core CPU: about the tiny run's time per variant and seed (see README / the issue notes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from experiments.common import run_experiment
from experiments.presets import LOO_VARIANTS, PRESETS, VARIANTS, build_plan


def compare(run_dirs: list[Path], out: Path, reference: str = "scalerl") -> dict:
    """Fit every run and write the comparison report (P(A_ref > A_variant) per variant)."""
    from scalerl_jax.scaling.report import fit_runs

    summary = fit_runs(run_dirs, out, fit_until=0.5)
    runs = summary["runs"]
    ref = [n for n in runs if n.startswith(reference + "_")]
    lines = ["# Leave-one-out comparison", "", "| run | A (90% CI) | B (90% CI) | C_mid | P(A_ScaleRL > A_run) |",
             "|---|---|---|---|---|"]
    def s(e, k):
        b = e["bayes"].get("summary", e["bayes"])
        return b.get(k, {})

    pair = {(r["run_1"], r["run_2"]): r for r in summary.get("pairwise", [])}
    for name, e in runs.items():
        a, b, c = s(e, "A"), s(e, "B"), s(e, "C_mid")
        p = ""
        if ref and name not in ref and (ref[0], name) in pair:
            p = f"{pair[(ref[0], name)]['P_A1_gt_A2']:.2f}"
        lines.append(f"| {name} | {a.get('mean', float('nan')):.3f} [{a.get('lo', float('nan')):.3f}, "
                     f"{a.get('hi', float('nan')):.3f}] | {b.get('mean', float('nan')):.2f} "
                     f"[{b.get('lo', float('nan')):.2f}, {b.get('hi', float('nan')):.2f}] | "
                     f"{c.get('mean', float('nan')):.4g} | {p} |")
    lines += ["", "Figures: A_posteriors.png (ceiling densities), efficiency.png, fit_<run>.png, table.png.", ""]
    (out / "comparison.md").write_text("\n".join(lines))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.loo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--seeds", type=int, default=1, help="seeds per variant (0..N-1)")
    ap.add_argument("--variants", nargs="+", default=["scalerl", *LOO_VARIANTS], choices=sorted(VARIANTS))
    ap.add_argument("--out", default=None, help="output directory (default runs/loo_<preset>)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps per run (overrides the preset)")
    args = ap.parse_args(argv)
    out = Path(args.out or f"runs/loo_{args.preset}")
    out.mkdir(parents=True, exist_ok=True)
    run_dirs = []
    t0 = time.time()
    for variant in args.variants:
        for seed in range(args.seeds):
            run_dir = out / f"{variant}_s{seed}"
            run_dirs.append(run_dir)
            if (run_dir / "summary.json").exists():
                print(f"[loo] {run_dir.name}: finished earlier, skipping")
                continue
            plan = build_plan(args.preset, variant, seed=seed)
            exp = plan.exp
            if args.steps:
                exp = dataclasses.replace(exp, train=dataclasses.replace(exp.train, steps=args.steps))
            plan = dataclasses.replace(plan, exp=dataclasses.replace(exp, out_dir=str(run_dir)))
            print(f"[loo] running {run_dir.name} ({time.time() - t0:.0f}s elapsed)", flush=True)
            run_experiment(plan, resume=(run_dir / "checkpoints").exists(), fit=False)
    summary = compare(run_dirs, out / "comparison")
    (out / "comparison" / "loo_summary.json").write_text(json.dumps({"runs": [str(d) for d in run_dirs],
                                                                      "seconds": time.time() - t0}, indent=2))
    print(f"[loo] {len(run_dirs)} runs in {time.time() - t0:.0f}s; report {out / 'comparison' / 'comparison.md'}")
    return 0 if summary else 1


if __name__ == "__main__":
    sys.exit(main())
