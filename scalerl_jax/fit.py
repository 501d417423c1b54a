"""Fit ScaleRL's compute -> reward law to finished or running runs and predict where they are heading.

    python -m scalerl_jax.fit RUN_DIR [RUN_DIR ...] --fit-until 0.5 [--target-compute X] [--exclude-below C] --out DIR
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import Annotated, Literal

import tyro

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


@dataclass(frozen=True)
class FitArgs:
    """The flags of a fit."""

    run_dirs: Annotated[tuple[str, ...], tyro.conf.Positional,
                        tyro.conf.arg(metavar="RUN_DIR [RUN_DIR ...]", help_behavior_hint="(at least one)")]
    """run directories holding metrics.jsonl (or the files themselves)"""
    out: str
    """output directory for summary.json, report.md and figures"""
    fit_until: float = 0.5
    """fit on evals with compute <= this fraction of each run's last eval compute"""
    fit_until_compute: float | None = None
    """fit on evals with compute <= this absolute value instead (same unit as --compute-key)"""
    target_compute: float | None = None
    """compute to predict the reward at (None: the run's last eval, or 2x the fit window)"""
    exclude_below: float | None = None
    """drop evals below this compute from the fits (the paper drops its first ~1.5k GPU-h)"""
    compute_key: Literal["device_hours", "flops"] = "device_hours"
    """eval-row column used as compute"""
    seed: int = 0
    """NUTS seed"""
    num_samples: int = 1000
    """posterior draws per chain"""
    num_chains: int = 4
    """NUTS chains, run vectorised"""
    plots: bool = True
    """write the figures (--no-plots: summary.json and report.md only)"""
    print_config: bool = False
    """print the resolved flags as JSON and exit"""


def parse_args(argv: list[str] | None = None) -> FitArgs:
    """The command line (``--help``): tyro over :class:`FitArgs`; a wrong type or value exits naming the flag."""
    prog = "python -m scalerl_jax.fit"
    args = tyro.cli(FitArgs, args=argv, prog=prog, description=DESCRIPTION)
    if not args.run_dirs:  # tyro reads a variadic positional as zero or more
        print(f"{prog}: error: give at least one RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    return args


def main(argv=None) -> int:
    """Entry point; returns the process exit status."""
    args = parse_args(argv)
    if args.print_config:
        print(json.dumps(dataclasses.asdict(args), indent=2))
        return 0
    from scalerl_jax.scaling.report import fit_runs  # imported late so that --help stays fast

    try:
        summary = fit_runs(
            args.run_dirs, args.out, fit_until=args.fit_until, target_compute=args.target_compute,
            exclude_below=args.exclude_below, fit_until_compute=args.fit_until_compute, compute_key=args.compute_key,
            seed=args.seed, num_samples=args.num_samples, num_chains=args.num_chains, make_plots=args.plots,
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
