"""Fit ScaleRL's compute -> reward law to finished or running runs and predict where they are heading.

    python -m scalerl_jax.fit RUN_DIR [RUN_DIR ...] --fit-until 0.5 [--target-compute X] [--exclude-below C] --out DIR

Other trainers' logs go through the same fit, beside or instead of run directories:

    python -m scalerl_jax.fit --csv curve.csv --compute-col gpu_hours --reward-col eval_acc \
        [--n-col N --k-col K] --out DIR
    python -m scalerl_jax.fit --tensorboard TB_DIR --compute-tag step --compute-per-step 0.02 \
        --reward-tag eval/acc --out DIR
    python -m scalerl_jax.fit --wandb-history history.json --compute-col _step --compute-per-step 0.02 \
        --reward-col eval/acc --out DIR   # or a W&B CSV export, wandb-history.jsonl, an offline run dir
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

Besides run directories (or instead of them), curves can come from other trainers' logs. Each file or directory
is one curve, named after it, or by --name (one name per source, in the order of the flags --csv, --tensorboard,
--wandb-history). Rows with a blank or NaN compute or reward are skipped with a warning; a missing column or a cell
that is not a number stops with an error naming the file, the line and the column (exit status 2).

A CSV file (--csv FILE) is a table with a header row: --compute-col and --reward-col name its columns; --n-col and
--k-col, when given, the prompts and samples per prompt of each eval (the binomial likelihood, as for run
directories).

TensorBoard event files (--tensorboard DIR, in DIR or in its one subdirectory holding them; needs the tensorboard
package): --compute-tag and --reward-tag name the scalars, matched by step; --compute-tag step uses the step.

A Weights & Biases run history (--wandb-history PATH) is a CSV export, the JSON of
run.history().to_json(orient="records"), wandb-history.jsonl, or the directory (or run-<id>.wandb file) that wandb
writes in offline mode; columns as for --csv, named as logged (e.g. eval/val_reward; W&B's step is _step).

Compute given in steps: --compute-per-step X multiplies the compute column (a step count) by X, e.g. with
--compute-col _step --compute-per-step 0.02 for 0.02 GPU-hours per step.

A run trained with a W&B project keeps its offline W&B run under RUN_DIR/wandb; the same curve reads back with
--wandb-history RUN_DIR --compute-col eval/device_hours --reward-col eval/val_reward --n-col eval/val_n --k-col
eval/val_k.
"""


@dataclass(frozen=True)
class FitArgs:
    """The flags of a fit."""

    run_dirs: Annotated[tuple[str, ...], tyro.conf.Positional,
                        tyro.conf.arg(metavar="RUN_DIR [RUN_DIR ...]", help_behavior_hint="(or another source)")]
    """run directories holding metrics.jsonl (or the files themselves)"""
    out: str
    """output directory for summary.json, report.md and figures"""
    csv: Annotated[tuple[str, ...], tyro.conf.arg(metavar="FILE [FILE ...]")] = ()
    """CSV files with a header row, one curve each (columns: --compute-col, --reward-col, --n-col, --k-col)"""
    tensorboard: Annotated[tuple[str, ...], tyro.conf.arg(metavar="DIR [DIR ...]")] = ()
    """directories of TensorBoard event files, one curve each (scalars: --compute-tag, --reward-tag)"""
    wandb_history: Annotated[tuple[str, ...], tyro.conf.arg(metavar="PATH [PATH ...]")] = ()
    """W&B run histories (CSV, JSON records, JSON lines, or an offline run directory), one curve each"""
    compute_col: str | None = None
    """column of --csv / --wandb-history holding compute (or a step count, with --compute-per-step)"""
    reward_col: str | None = None
    """column of --csv / --wandb-history holding the eval reward"""
    n_col: str | None = None
    """column of --csv / --wandb-history with the prompts per eval (with --k-col: binomial likelihood)"""
    k_col: str | None = None
    """column of --csv / --wandb-history with the samples per prompt of each eval"""
    compute_tag: str | None = None
    """scalar tag of --tensorboard holding compute; "step" uses the event's step"""
    reward_tag: str | None = None
    """scalar tag of --tensorboard holding the eval reward"""
    n_tag: str | None = None
    """scalar tag of --tensorboard with the prompts per eval"""
    k_tag: str | None = None
    """scalar tag of --tensorboard with the samples per prompt of each eval"""
    compute_per_step: float | None = None
    """compute per step: multiplies the compute column/tag (a step count) into compute, for the sources above"""
    name: Annotated[tuple[str, ...], tyro.conf.arg(metavar="NAME [NAME ...]")] = ()
    """names of the curves from --csv, --tensorboard, --wandb-history, in that order (none: each path's name)"""
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
    def fail(msg: str):
        print(f"{prog}: error: {msg}", file=sys.stderr)
        raise SystemExit(2)

    n_other = len(args.csv) + len(args.tensorboard) + len(args.wandb_history)
    if not args.run_dirs and not n_other:  # tyro reads a variadic positional as zero or more
        fail("give at least one RUN_DIR, --csv, --tensorboard or --wandb-history")
    if (args.csv or args.wandb_history) and not (args.compute_col and args.reward_col):
        fail("--csv and --wandb-history need --compute-col and --reward-col (the columns holding compute and reward)")
    if args.tensorboard and not (args.compute_tag and args.reward_tag):
        fail("--tensorboard needs --compute-tag and --reward-tag (the scalars holding compute and reward; "
             "--compute-tag step uses the step)")
    if args.name and len(args.name) != n_other:
        fail(f"--name gives {len(args.name)} names for {n_other} curves from --csv, --tensorboard, --wandb-history")
    return args


def other_curves(args: FitArgs) -> list:
    """The RunCurves of the --csv, --tensorboard and --wandb-history sources, in that order."""
    from scalerl_jax.scaling import sources

    names = iter(args.name) if args.name else None
    cols = {"n_col": args.n_col, "k_col": args.k_col, "compute_per_step": args.compute_per_step}
    curves = []
    for path in args.csv:
        curves.append(sources.load_csv(path, args.compute_col, args.reward_col, **cols,
                                       name=next(names) if names else None))
    for path in args.tensorboard:
        curves.append(sources.load_tensorboard(path, args.compute_tag, args.reward_tag, n_tag=args.n_tag,
                                               k_tag=args.k_tag, compute_per_step=args.compute_per_step,
                                               name=next(names) if names else None))
    for path in args.wandb_history:
        curves.append(sources.load_wandb_history(path, args.compute_col, args.reward_col, **cols,
                                                 name=next(names) if names else None))
    return curves


def main(argv=None) -> int:
    """Entry point; returns the process exit status."""
    args = parse_args(argv)
    if args.print_config:
        print(json.dumps(dataclasses.asdict(args), indent=2))
        return 0
    from scalerl_jax.scaling.report import fit_runs  # imported late so that --help stays fast

    try:
        summary = fit_runs(
            [*args.run_dirs, *other_curves(args)], args.out, fit_until=args.fit_until,
            target_compute=args.target_compute,
            exclude_below=args.exclude_below, fit_until_compute=args.fit_until_compute, compute_key=args.compute_key,
            seed=args.seed, num_samples=args.num_samples, num_chains=args.num_chains, make_plots=args.plots,
        )
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, e in summary["runs"].items():
        p = e["prediction"]
        msg = (f"{name}: R({e['target_compute']:.4g}) = {p['mean']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}], one eval "
               f"there [{p['eval_lo']:.3f}, {p['eval_hi']:.3f}]")
        if "held_out" in e:
            h = e["held_out"]
            msg += f"; error at {h['compute_nearest_target']:.4g}: {h['error_nearest_target']:+.3f}"
        print(msg)
    print(f"wrote {args.out}/summary.json and report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
