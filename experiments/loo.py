"""Leave-one-out ablations of ScaleRL (and the paper's baseline recipes), with one comparison report.

Launch::

    python -m experiments.loo --preset tiny                       # ScaleRL + every leave-one-out variant, seed 0
    python -m experiments.loo --preset tiny --seeds 3 --variants scalerl no_npr bf16_head
    python -m experiments.loo --preset smoke --variants scalerl ppo_off_policy --out runs/loo_smoke
    python -m experiments.loo --preset tiny --variants scalerl dapo --set train.lr=1e-4 --out runs/loo_lr1e-4
    python -m experiments.loo --preset small --model DIR --data FILE.jsonl --generators 2 --variants scalerl gspo

``--model``, ``--data``, ``--sglang-urls`` and ``--generators`` act as in ``experiments.math_8b``: every variant is a
run of the same path on that base model and data. Runs go one after another into ``<out>/<variant>_s<seed>``. A run
there is reused only when its config.json equals the planned one (:func:`config_differences`): a finished run is
skipped and an interrupted one resumes from its checkpoint, so the command can simply be re-issued; a run of another
config (``--steps``, ``--set``, another ``--model``) is moved to ``<out>/superseded/`` and run again, and the
command says which fields differ. With a preset's own base model, all variants of one
seed start RL from one supervised warm start, ``<out>/warmstart_s<seed>`` (trained once; the paper's variants
likewise share a base model), so only the RL differs between them. At the end the
sigmoid law is fitted to every run (on its whole compute) and
``<out>/comparison/comparison.md`` tabulates the end reward, A, B, C_mid with 90 % intervals and
P(A_ScaleRL > A_variant), P(B_ScaleRL > B_variant) against ScaleRL of the same seed; with several seeds, each
variant's A and B averaged over its seeds and P(ScaleRL's average > the variant's). The same folder holds the
overlaid curves, the ceiling densities and every fit's report.md. ``--fit-until 0.5`` (the paper's half-compute
protocol; finished runs are not rerun) writes ``<out>/comparison_until0.5`` with each run's prediction of its last
eval from the first half, its error and whether the 90 % interval covered it.

The results store (``--store``, default ``results/<name of --out>``; experiments/store.py): each finished run's
small files (config, metrics, summary, report, figures; no checkpoints or weights) are copied there as it finishes
(``--commit``: and git-committed), with the comparison beside them. A planned run found finished in the store with
the same config is not run again, so a study committed from one machine continues on another from a clone, and
its comparison is rebuilt from the stored files. Cost on a 2-core CPU: about the tiny run's
RL time per variant and seed, plus one warm start per seed (docs/results/loo_tiny.md).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro
from scalerl_jax.experiments.common import ExperimentPlan, Flattened, cli_error, parse_cli, preset_help
from scalerl_jax.experiments.math_8b import VariantName, apply_run_flags, first_pass
from scalerl_jax.experiments.numerics import NUMERICS
from scalerl_jax.experiments.presets import LOO_VARIANTS, PRESETS, VARIANTS, build_plan
from scalerl_jax.experiments.run_path import run_experiment
from scalerl_jax.experiments.store import commit_run, default_store, store_comparison, store_run, stored_run

from scalerl_jax.config import ConfigError, ExperimentConfig

ComputeKey = Literal["flops", "device_hours"]


@dataclass(frozen=True)
class LooArgs:
    """The flags of a leave-one-out study; ``exp`` holds the config of each run (every field a flag), parsed once
    per variant and seed with that run's config as the defaults."""

    preset: Annotated[str, tyro.conf.arg(metavar="NAME")] = "tiny"
    """size preset of every run (one of those listed above)"""
    seeds: int = 1
    """seeds per variant (0..N-1)"""
    variants: Annotated[tuple[VariantName, ...], tyro.conf.arg(metavar="VARIANT [VARIANT ...]")] = (
        "scalerl", *LOO_VARIANTS)
    """runs to make and compare: ScaleRL and its leave-one-out swaps, or any of the variants"""
    out: str | None = None
    """output directory (default runs/loo_<preset>)"""
    steps: int | None = None
    """RL steps per run (overrides the preset)"""
    model: str | None = None
    """HF checkpoint dir of the base model every run starts from (no warm start), as in experiments.math_8b"""
    data: str | None = None
    """jsonl training data of every run (question/answer rows), as in experiments.math_8b"""
    sglang_urls: Annotated[tuple[str, ...] | None, tyro.conf.arg(metavar="URL [URL ...]")] = None
    """generate with these SGLang servers (or one sglang-router URL in front of them), one run after another"""
    generators: Annotated[int | None, tyro.conf.arg(metavar="N")] = None
    """each run starts N local SGLang-API servers behind a real sglang-router and stops them at its end; 0: the
    embedded in-process engine"""
    compute_key: tuple[ComputeKey, ...] = ("flops", "device_hours")
    """compute axes to compare on; the first goes to <out>/comparison, others to <out>/comparison_<key>. FLOPs (train
    + generation) are counted, so they do not depend on how loaded the machine was; device-hours (wall time minus
    evals) also credit PipelineRL's overlap of generation and training, but a busy machine inflates them"""
    fit_until: float = 1.0
    """fraction of each run's compute the sigmoid is fitted on (1.0: the whole run, for comparing variants; 0.5: the
    paper's half-compute protocol)"""
    store: Annotated[str, tyro.conf.arg(metavar="DIR|auto|none")] = "auto"
    """results store (experiments/store.py): each finished run's small files are copied to DIR/<run>, and a planned
    run found finished there with the same config is not run again; auto: results/<name of --out> in the working
    directory (the repository); none: no store"""
    commit: bool = False
    """git-commit each run's stored files as it finishes (a long study continued on another machine from a clone)"""
    print_config: bool = False
    """print every run's resolved configuration as JSON and exit"""
    set: Annotated[tuple[str, ...], tyro.conf.arg(metavar="FIELD=VALUE"), tyro.conf.UseAppendAction] = ()
    """alias of a field's flag (--set train.lr=1e-4 is --train.lr 1e-4); a field flag sets that field in every run
    after its variant is applied, so setting the field a variant swaps undoes that variant"""
    exp: Annotated[ExperimentConfig, Flattened] = dataclasses.field(default_factory=ExperimentConfig)


def parse_runs(argv: list[str], prog: str = "python -m experiments.loo") -> tuple[LooArgs, dict[tuple[str, int], Any]]:
    """Parse the command line once per (variant, seed) with that run's plan as the defaults: the study's flags and
    each run's ExperimentPlan (field flags applied). Every run is checked here, before any of them starts."""
    import argparse

    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--variants", nargs="+", default=["scalerl", *LOO_VARIANTS])
    ap.add_argument("--seeds", default="1")
    preset, _, _ = first_pass(argv, PRESETS, prog)
    first, _ = ap.parse_known_args(argv)
    seeds = int(first.seeds) if first.seeds.isdigit() else 1
    variants = [v for v in first.variants if v in VARIANTS] or ["scalerl"]
    description = f"{__doc__}\n\n{preset_help(PRESETS, VARIANTS, LOO_VARIANTS)}"
    args, plans = None, {}
    for variant in variants:
        for seed in range(max(seeds, 1)):
            plan = build_plan(preset or "tiny", variant, seed=seed)
            args = parse_cli(LooArgs, LooArgs(preset=preset or "tiny", exp=plan.exp), argv, prog=prog,
                             description=description)
            plans[variant, seed] = apply_run_flags(plan, args, prog)
    return args, plans


#: config fields added after runs were written, with the value every run written before them ran with: a stored
#: run whose config.json lacks one ran with this value (``train.row_buckets``: the full batch in every step, so a
#: study stored before it is continued with ``--set train.row_buckets=1``, its FLOPs counted the same way;
#: ``data.arith_b_max``: every a+b*c with b <= 99)
ADDED_FIELDS: dict[str, Any] = {"train.row_buckets": 1, "data.arith_b_max": 99}

#: the live forecast's fields that decide how a run goes (an early stop against a baseline); its other fields only
#: shape the forecast rows, so a stored run with other values of them is still the planned run
FORECAST_DECIDES = ("baseline", "stop_if_worse", "stop_min_evals", "stop_confirmations", "min_evals")


def config_differences(plan: ExperimentPlan, written: dict[str, Any]) -> list[str]:
    """Where a run's ``config.json`` (``written``) differs from what ``plan`` decides: one ``"field: ran X, planned
    Y"`` per differing field, none when the run is the planned one. Every config field is compared except the ones
    the plan does not decide: ``out_dir`` (where the run is), the model's architecture (it comes from the base
    checkpoint, compared as ``base_model`` when the plan names one; of ``model`` the numerics the preset decides are
    compared, :data:`~experiments.numerics.NUMERICS`), ``data.path`` when the preset supplies its own data, and a
    planned ``"auto"`` (measured from the data by the run), and the live forecast's analysis settings (its compute
    axis, NUTS sizes, time share: they shape the forecast rows written beside the run, never its training; a study
    fits every run again on its own ``--compute-key``); the forecast fields that can stop a run
    (:data:`FORECAST_DECIDES`) are compared. Keys only the run writes (``sandbox_active``) are ignored."""
    planned = json.loads(json.dumps(dataclasses.asdict(plan.exp), default=str))
    planned.pop("out_dir", None)
    planned["forecast"] = {k: v for k, v in planned["forecast"].items() if k in FORECAST_DECIDES}
    planned["model"] = {k: v for k, v in planned["model"].items() if k in NUMERICS}
    if not planned["data"].get("path"):
        planned["data"].pop("path", None)
    if plan.base_model:
        planned["base_model"] = str(Path(plan.base_model).resolve())
        if isinstance(written.get("base_model"), str):
            written = {**written, "base_model": str(Path(written["base_model"]).resolve())}
    diffs: list[str] = []

    def walk(p: Any, w: Any, path: str) -> None:
        if isinstance(p, dict):
            for k, v in p.items():
                walk(v, w.get(k, _MISSING) if isinstance(w, dict) else _MISSING, f"{path}.{k}" if path else k)
        else:
            if w is _MISSING and path in ADDED_FIELDS:
                w = ADDED_FIELDS[path]
            if p != w and p != "auto":
                diffs.append(f"{path}: ran {'nothing (absent)' if w is _MISSING else _short(w)}, planned "
                             f"{_short(p)}")

    walk(planned, written, "")
    return diffs


_MISSING = object()


def _short(v: Any, n: int = 160) -> str:
    text = json.dumps(v)
    return text if len(text) <= n else text[: n - 3] + "..."


def run_state(run_dir: Path, plan: ExperimentPlan) -> tuple[str, list[str]]:
    """What the study does with ``run_dir`` for ``plan``: ``("finished", [])`` reuses a finished run of the same
    config, ``("resume", [])`` continues an unfinished one from its checkpoints, ``("fresh", [])`` starts one
    (nothing there, or a run of the same config killed before its first checkpoint), ``("replace", why)`` starts
    over after moving aside a run of another config (``why``: :func:`config_differences`, or that there is no
    config.json to compare)."""
    from scalerl_jax.experiments.run_path import RUN_OUTPUTS, checkpoint_steps_on_disk

    cfg = run_dir / "config.json"
    if not cfg.is_file():
        held = [n for n in RUN_OUTPUTS if (run_dir / n).exists()]
        return ("replace", [f"it holds {', '.join(held)} but no config.json to compare"]) if held else ("fresh", [])
    try:
        written = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as e:
        return "replace", [f"{cfg} is unreadable ({e})"]
    diffs = config_differences(plan, written) if isinstance(written, dict) else [f"{cfg} is not a JSON object"]
    if diffs:
        return "replace", diffs
    if (run_dir / "summary.json").exists():
        return "finished", []
    return ("resume" if checkpoint_steps_on_disk(run_dir) else "fresh"), []


def _move_aside(run_dir: Path, into: Path) -> Path:
    """Move ``run_dir`` to ``into/<name>.<k>`` (the first free k from 1): a replaced run is kept, never deleted."""
    into.mkdir(parents=True, exist_ok=True)
    k = 1
    while (into / f"{run_dir.name}.{k}").exists():
        k += 1
    dest = into / f"{run_dir.name}.{k}"
    run_dir.rename(dest)
    return dest


def _variant_seed(run_dir) -> tuple[str, str]:
    """``dapo_s1`` -> ("dapo", "1")."""
    variant, _, seed = Path(run_dir).name.rpartition("_s")
    return variant, seed


def plot_curves(loaded: dict, out: Path, reference: str = "scalerl", compute_key: str = "flops") -> list[str]:
    """``curves.png``: one panel per variant, its validation reward against compute (one line per seed) over the
    reference recipe's curves of the same seeds (black), so each swap is read against ScaleRL directly.
    ``loaded``: run name -> its RunCurve."""
    import matplotlib.pyplot as plt

    from scalerl_jax.scaling.plots import save

    curves: dict[str, dict[str, object]] = {}
    for name, curve in loaded.items():
        variant, seed = _variant_seed(name)
        curves.setdefault(variant, {})[seed] = curve
    ref = curves.get(reference, {})
    variants = [v for v in curves if v != reference] or list(curves)
    if not variants:
        return []
    cols = min(4, len(variants))
    rows = -(-len(variants) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.5 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, variant in zip(axes.flat, variants):
        for seed, c in sorted(ref.items()):
            ax.plot(c.compute, c.reward, color="k", lw=1.0, alpha=0.7, label=f"{reference} s{seed}")
        for j, (seed, c) in enumerate(sorted(curves[variant].items())):
            ax.plot(c.compute, c.reward, color=f"C{j}", lw=1.4, label=f"{variant} s{seed}")
        ax.set_title(variant, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(variants):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel(compute_key, fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("val reward", fontsize=8)
    axes.flat[0].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return save(fig, out, "curves")


def compare(run_dirs: list[Path], out: Path, reference: str = "scalerl", fit_until: float = 1.0,
            compute_key: str = "flops") -> dict:
    """Fit every run on its first ``fit_until`` of compute and write ``out/comparison.md``: A, B, C_mid with 90 %
    intervals, the measured end reward, and P(A_ref > A_run), P(B_ref > B_run) against the reference run of the
    same seed. A run with too few evals to fit is listed with the reason instead of failing the report."""
    from scalerl_jax.scaling.io import fit_window, load_run
    from scalerl_jax.scaling.report import fit_runs

    if not 0 < fit_until <= 1:
        raise ValueError(f"fit_until is a fraction of each run's compute in (0, 1], got {fit_until}")
    out.mkdir(parents=True, exist_ok=True)
    fittable, unfit, loaded = [], {}, {}
    for d in run_dirs:
        try:
            loaded[Path(d).name] = curve = load_run(d, compute_key=compute_key)
            mask, _ = fit_window(curve, fit_until)
            if int(mask.sum()) < 5:
                raise ValueError(f"{int(mask.sum())} evals in the fit window, need 5")
            fittable.append(d)
        except (OSError, ValueError) as e:
            unfit[Path(d).name] = str(e)
    posteriors = {}
    summary = (fit_runs(fittable, out, fit_until=fit_until, compute_key=compute_key, posteriors_out=posteriors)
               if fittable else {"runs": {}, "pairwise": []})
    runs = summary["runs"]
    pair = {(r["run_1"], r["run_2"]): r for r in summary.get("pairwise", [])}

    def stat(e, k):
        return e["bayes"].get("summary", e["bayes"]).get(k, {})

    def ci(d, fmt):
        nan = float("nan")
        return f"{d.get('mean', nan):{fmt}} [{d.get('lo', nan):{fmt}}, {d.get('hi', nan):{fmt}}]"

    lines = ["# Leave-one-out comparison", "",
             f"Each run's sigmoid is fitted on the first {fit_until:.0%} of its compute (`{compute_key}`). "
             "The end reward is the mean of the last 3 evals. P(·) compares the ScaleRL run of the same seed with "
             "the row's run: above 0.5 means ScaleRL's ceiling A (efficiency B) is the larger.", "",
             "| run | end reward | Δ vs ScaleRL | A (90% CI) | B (90% CI) | C_mid | P(A_ScaleRL > A) "
             "| P(B_ScaleRL > B) |",
             "|---|---|---|---|---|---|---|---|"]
    ends = {name: float(c.reward[-3:].mean()) for name, c in loaded.items()}
    for d in run_dirs:
        name = Path(d).name
        ref = f"{reference}_s{_variant_seed(name)[1]}"
        end = ends.get(name, float("nan"))
        delta = f"{end - ends[ref]:+.3f}" if name in ends and ref in ends and name != ref else ""
        if name in unfit:
            lines.append(f"| {name} | {end:.3f} | {delta} | not fitted: {unfit[name]} | | | | |")
            continue
        e = runs[name]
        pa = pb = ""
        if name != ref and (ref, name) in pair:
            pa, pb = f"{pair[(ref, name)]['P_A1_gt_A2']:.2f}", f"{pair[(ref, name)]['P_B1_gt_B2']:.2f}"
        lines.append(f"| {name} | {end:.3f} | {delta} | {ci(stat(e, 'A'), '.3f')} | {ci(stat(e, 'B'), '.2f')} | "
                     f"{stat(e, 'C_mid').get('mean', float('nan')):.4g} | {pa} | {pb} |")
    if fit_until < 1 and runs:
        lines += _prediction_table(runs, fit_until, compute_key)
    seeds = _seed_average(runs, posteriors, out, reference)
    if seeds:
        lines += _seed_table(seeds, reference)
        summary["over_seeds"] = {v: {k: x for k, x in row.items() if k != "draws"} for v, row in seeds.items()}
    plot_curves(loaded, out, reference, compute_key)
    lines += ["", "Figures in this directory: curves.png (each variant's reward curves over ScaleRL's, per seed), "
              "A_posteriors.png (ceiling densities), efficiency.png (log F(R) against log C: slope B), "
              + ("A_over_seeds.png (each variant's seed-averaged ceiling), " if seeds else "")
              + "fit_<run>.png, table.png; report.md has every fit's detail.", ""]
    (out / "comparison.md").write_text("\n".join(lines))
    summary["not_fitted"] = unfit
    return summary


def _prediction_table(runs: dict, fit_until: float, compute_key: str) -> list[str]:
    """The half-compute protocol per run (fit on the first ``fit_until``, predict the last eval) and, per variant,
    the mean |error| over its seeds, how many predictions the 90 % interval covered, and the mean width of A's
    90 % interval."""
    lines = ["", f"## Prediction from the first {fit_until:.0%} of compute (`{compute_key}`)", "",
             "| run | predicted end (90% CI) | observed | error | covered | A 90% width |", "|---|---|---|---|---|---|"]
    per_variant: dict[str, list] = {}
    for name, e in runs.items():
        if "held_out" not in e:
            continue
        p, h = e["prediction"], e["held_out"]
        a = e["bayes"].get("summary", e["bayes"])["A"]
        err, width = h["error_nearest_target"], a["hi"] - a["lo"]
        covered = p["lo"] <= h["observed_nearest_target"] <= p["hi"]
        per_variant.setdefault(_variant_seed(name)[0], []).append((abs(err), covered, width))
        lines.append(f"| {name} | {p['mean']:.3f} [{p['lo']:.3f}, {p['hi']:.3f}] | {h['observed_nearest_target']:.3f} "
                     f"| {err:+.3f} | {'yes' if covered else 'no'} | {width:.3f} |")
    lines += ["", "| variant | seeds | mean abs error | covered | mean A 90% width |", "|---|---|---|---|---|"]
    for v, rows in per_variant.items():
        errs, cov, widths = zip(*rows)
        lines.append(f"| {v} | {len(rows)} | {sum(errs) / len(rows):.3f} | {sum(cov)}/{len(rows)} | "
                     f"{sum(widths) / len(rows):.3f} |")
    return lines


def _seed_average(runs: dict, posteriors: dict, out: Path, reference: str) -> dict:
    """``over_seeds`` on the fitted runs' posterior draws, when some recipe has more than one seed; draws
    ``A_over_seeds.png`` (each recipe's seed-averaged ceiling, one shared axis)."""
    import types

    from scalerl_jax.scaling.compare import over_seeds
    from scalerl_jax.scaling.plots import plot_A_posteriors, save

    by_recipe: dict[str, dict[str, dict]] = {}
    for name in runs:
        variant, seed = _variant_seed(name)
        by_recipe.setdefault(variant, {})[seed] = posteriors[name].samples
    if reference not in by_recipe or max(len(s) for s in by_recipe.values()) < 2:
        return {}
    seeds = over_seeds(by_recipe, reference)
    save(plot_A_posteriors({v: types.SimpleNamespace(samples={"A": row["draws"]["A"]}) for v, row in seeds.items()}),
         out, "A_over_seeds")
    return seeds


def _seed_table(seeds: dict, reference: str) -> list[str]:
    lines = ["", "## Over seeds", "",
             f"Each variant's A and B averaged over the seeds it shares with {reference} (one draw of every seed's "
             f"posterior per sample), and P({reference}'s average > the variant's); 'seeds' counts the seeds whose own "
             "fit puts the reference above.", "",
             "| variant | seeds | A (90% CI) | B (90% CI) | P(A_ref > A) | seeds A_ref > A | P(B_ref > B) | "
             "seeds B_ref > B |", "|---|---|---|---|---|---|---|---|"]
    for v, r in seeds.items():
        n = len(r["seeds"])
        cells = ["", "", "", ""] if v == reference else [f"{r['P_A_ref_gt']:.2f}", f"{r['seeds_A_ref_gt']}/{n}",
                                                         f"{r['P_B_ref_gt']:.2f}", f"{r['seeds_B_ref_gt']}/{n}"]
        lines.append(f"| {v} | {n} | {r['A']['mean']:.3f} [{r['A']['lo']:.3f}, {r['A']['hi']:.3f}] | "
                     f"{r['B']['mean']:.2f} [{r['B']['lo']:.2f}, {r['B']['hi']:.2f}] | " + " | ".join(cells) + " |")
    return lines


def _stored_differences(store: Path, name: str, plan: ExperimentPlan) -> tuple[Path | None, list[str]]:
    """The store's finished copy of run ``name`` (None when there is none) and how its config differs from
    ``plan`` (:func:`config_differences`; empty: it is the planned run)."""
    kept = stored_run(store, name)
    if kept is None:
        return None, []
    try:
        written = json.loads((kept / "config.json").read_text())
        if not isinstance(written, dict):
            return kept, [f"{kept / 'config.json'} is not a JSON object"]
        return kept, config_differences(plan, written)
    except (OSError, json.JSONDecodeError) as e:
        return kept, [f"{kept / 'config.json'} is unreadable ({e})"]


def _from_store(store: Path, name: str, plan: ExperimentPlan) -> Path | None:
    """The stored copy of run ``name`` when it finished with the planned config, else None (said why)."""
    kept, diffs = _stored_differences(store, name, plan)
    if kept is None:
        return None
    if diffs:
        print(f"[loo] {name}: the stored run {kept} differs from the planned one ({'; '.join(diffs)}); running it")
        return None
    print(f"[loo] {name}: finished in the results store with the same config ({kept}), not running it again")
    return kept


def _keep(run_dir: Path, store: Path, commit: bool) -> None:
    """Copy a finished run into the store (a stored run of another config is moved to ``<store>/superseded``)."""
    earlier = store / run_dir.name
    if earlier.exists():
        moved = _move_aside(earlier, store / "superseded")
        print(f"[loo] {run_dir.name}: the store's earlier copy moved to {moved}")
    kept = store_run(run_dir, store)
    print(f"[loo] {run_dir.name}: stored its small files in {kept}", flush=True)
    if commit and commit_run(kept):
        print(f"[loo] {run_dir.name}: committed {kept}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``); returns the exit status."""
    args, plans = parse_runs(list(sys.argv[1:] if argv is None else argv))
    if not 0 < args.fit_until <= 1:
        cli_error("python -m experiments.loo", f"--fit-until is a fraction of each run's compute in (0, 1], got "
                  f"{args.fit_until}")
    if args.print_config:
        print(json.dumps({f"{v}_s{s}": dataclasses.asdict(p.exp) for (v, s), p in plans.items()}, indent=2))
        return 0
    from scalerl_jax.checkpoint import ResumeError

    out = Path(args.out or f"runs/loo_{args.preset}")
    out.mkdir(parents=True, exist_ok=True)
    store = None if args.store == "none" else default_store(out) if args.store == "auto" else Path(args.store)
    if store is not None:
        print(f"[loo] results store: {store} (--store none: no store)")
    run_dirs = []
    t0 = time.time()
    for variant in args.variants:
        for seed in range(args.seeds):
            run_dir = out / f"{variant}_s{seed}"
            run_dirs.append(run_dir)
            plan = plans[variant, seed]
            plan = dataclasses.replace(plan, exp=dataclasses.replace(plan.exp, out_dir=str(run_dir)))
            state, why = run_state(run_dir, plan)
            if state != "finished" and store is not None:
                kept = _from_store(store, run_dir.name, plan)
                if kept is not None:
                    run_dirs[-1] = kept
                    continue
            if state == "finished":
                print(f"[loo] {run_dir.name}: finished earlier with the same config, skipping")
                if store is not None:
                    kept, diffs = _stored_differences(store, run_dir.name, plan)
                    if kept is None or diffs:
                        _keep(run_dir, store, args.commit)
                continue
            if state == "replace":
                moved = _move_aside(run_dir, out / "superseded")
                print(f"[loo] {run_dir.name}: the run there differs from the planned one ({'; '.join(why)}); moved "
                      f"it to {moved} and running it again", flush=True)
            print(f"[loo] running {run_dir.name} ({time.time() - t0:.0f}s elapsed)", flush=True)
            # every variant of one seed starts RL from the same supervised warm start (trained once, by the first);
            # an unfinished run of the same config continues from its last checkpoint, one killed before its first
            # starts over
            try:
                run_experiment(plan, resume=state == "resume", fit=False, overwrite=True,
                               warm_dir=out / f"warmstart_s{seed}")
            except ConfigError as e:
                print(f"[loo] {run_dir.name}: error: {e}", file=sys.stderr)
                return 2
            except ResumeError as e:
                print(f"[loo] {run_dir.name}: error: resuming its checkpoints: {e}; move {run_dir} aside to start "
                      "it over", file=sys.stderr)
                return 1
            if store is not None:
                _keep(run_dir, store, args.commit)
    # a first-part fit (--fit-until 0.5) gets folders of its own, so it does not overwrite the whole-run comparison
    tail = "" if args.fit_until == 1 else f"_until{args.fit_until:g}"
    dirs = [out / (f"comparison{tail}" if i == 0 else f"comparison{tail}_{key}")
            for i, key in enumerate(args.compute_key)]
    summaries = [compare(run_dirs, d, fit_until=args.fit_until, compute_key=key)
                 for d, key in zip(dirs, args.compute_key)]
    summary = summaries[0]
    (dirs[0] / "loo_summary.json").write_text(json.dumps({"runs": [str(d) for d in run_dirs],
                                                          "seconds": time.time() - t0}, indent=2))
    if store is not None:
        for d in dirs:  # the comparison's table and figures beside the stored runs (rebuilt by re-issuing the command)
            store_comparison(d, store / d.name)
    print(f"[loo] {len(run_dirs)} runs in {time.time() - t0:.0f}s; report {dirs[0] / 'comparison.md'}")
    if not summary["runs"]:
        print("[loo] no run could be fitted (each needs 5 evals in its fit window); comparison.md says why per run",
              file=sys.stderr)
    return 0 if summary["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
