"""Fit ScaleRL's compute -> reward law to finished or running runs and predict where they are heading.

    python -m scalerl_jax.fit RUN_DIR [RUN_DIR ...] --fit-until 0.5 [--target-compute X] [--exclude-below C] --out DIR
"""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) to each run's eval curve (metrics.jsonl, rows with
"kind": "eval"), using only the first part of the run's compute, and predict the reward further out.

For every run this writes, under --out: summary.json (grid fit as in the paper, NumPyro posterior of
A, B, C_mid with 90 % intervals and diagnostics, plain power law for comparison, the prediction at the
target compute and, where the run continued past the fit window, the prediction's error), report.md, and
PNG + SVG figures: fit_<run> (data, fit window, posterior mean with 50/90 % bands, extrapolation),
A_posteriors (the predicted ceilings), efficiency (log F(R) vs log C, slope B) and table (A, B, C_mid
and pairwise P(A1 > A2), P(B1 > B2)). With several runs it also applies the paper's rule: A's within
0.02 are compared by B at a shared A.
"""


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(prog="python -m scalerl_jax.fit", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directory holding metrics.jsonl (or the file)")
    p.add_argument("--out", required=True, help="output directory for summary.json, report.md and figures")
    p.add_argument("--fit-until", type=float, default=0.5,
                   help="fit on evals with compute <= this fraction of each run's last eval compute (default 0.5)")
    p.add_argument("--fit-until-compute", type=float, default=None,
                   help="fit on evals with compute <= this absolute value instead (same unit as --compute-key)")
    p.add_argument("--target-compute", type=float, default=None,
                   help="compute to predict the reward at (default: the run's last eval, or 2x the fit window)")
    p.add_argument("--exclude-below", type=float, default=None,
                   help="drop evals below this compute from the fits (the paper drops its first ~1.5k GPU-h)")
    p.add_argument("--compute-key", default="device_hours", choices=["device_hours", "flops"],
                   help="eval-row column used as compute (default device_hours)")
    p.add_argument("--seed", type=int, default=0, help="NUTS seed")
    p.add_argument("--num-samples", type=int, default=1000, help="posterior draws per chain (default 1000)")
    p.add_argument("--num-chains", type=int, default=4, help="NUTS chains, run vectorised (default 4)")
    p.add_argument("--no-plots", action="store_true", help="write summary.json and report.md only")
    return p


def main(argv=None) -> int:
    """Entry point; returns the process exit status."""
    args = build_parser().parse_args(argv)
    from scalerl_jax.scaling.report import fit_runs  # imported late so that --help stays fast

    try:
        summary = fit_runs(
            args.run_dirs, args.out, fit_until=args.fit_until, target_compute=args.target_compute,
            exclude_below=args.exclude_below, fit_until_compute=args.fit_until_compute, compute_key=args.compute_key,
            seed=args.seed, num_samples=args.num_samples, num_chains=args.num_chains, make_plots=not args.no_plots,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, e in summary["runs"].items():
        p = e["prediction"]
        msg = f"{name}: R({e['target_compute']:.4g}) = {p['mean']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}]"
        if "held_out" in e:
            h = e["held_out"]
            msg += f"; error at {h['compute_nearest_target']:.4g}: {h['error_nearest_target']:+.3f}"
        print(msg)
    print(f"wrote {args.out}/summary.json and report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
