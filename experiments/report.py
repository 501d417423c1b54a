"""The reports: a run's report.md (:func:`write_report`, with the live forecast's section and figure) and a study's
comparison of its runs (:func:`compare`: comparison.md, the overlaid curves, the seed averages).

The run path writes report.md at the end of every run (:mod:`experiments.run_path`); ``experiments.loo`` writes the
comparison once its runs are finished. Both read only what a run directory holds (metrics.jsonl, the fit's summary),
so a comparison rebuilt from the results store (:mod:`experiments.store`) is the one the study wrote.
"""

from __future__ import annotations

from pathlib import Path

from scalerl_jax.experiments.presets import ExperimentPlan

# ---- a run's report.md -------------------------------------------------------------------------------------


def write_report(run_dir: Path, plan: ExperimentPlan, summary: dict, fit_summary: dict | None, log=print) -> None:
    """report.md: what ran, the reward curve, the fit and how its half-compute prediction held up; first the live
    forecast's history goes into ``summary`` and its figure into ``fit/`` (:func:`forecast_report`)."""
    from scalerl_jax.metrics import read_metrics

    forecast_report(run_dir, summary, log=log)

    exp = plan.exp
    evals = read_metrics(run_dir, "eval")
    lines = [f"# {exp.name}: ScaleRL run report", "",
             f"Run directory `{run_dir}`. Variant `{plan.variant}`. Model {exp.model.num_params() / 1e6:.2f}M params, "
             f"loss {exp.loss.kind} (aggregation {exp.loss.aggregation}, normalisation {exp.loss.normalization}, "
             f"zero-variance filter {exp.loss.filter_zero_variance}), {exp.rollout.mode} k={exp.rollout.k}, "
             f"{exp.rollout.prompts_per_batch} prompts x {exp.rollout.group_size} samples, LM head "
             f"{exp.model.head_dtype}, NPR {exp.data.npr}, length control {exp.rollout.length.kind}.", "",
             "## What happened", "",
             (f"- Base model: `{plan.base_model}` (given with --model; no warm start)." if plan.base_model else
              f"- Warm start: {plan.warm_steps} supervised steps "
              + (f"({summary['warmstart_seconds']:.0f}s)" if summary.get("warmstart_seconds")
                 else f"(reused from `{summary.get('warmstart_dir', 'warmstart')}`)")
              + (f"; {plan.warm_unmarked_frac:.0%} of its targets work the scratchpad but commit to no answer or "
                 "to the wrong one (the preset's docstring says how), so the warm-started policy often computes the "
                 "answer without committing to it: what RL has to learn." if plan.warm_unmarked_frac else ".")),
             f"- Data: {summary.get('n_train', '?')} training prompts, {summary.get('n_val', '?')} validation "
             f"prompts ({exp.data.source}{' `' + exp.data.path + '`' if exp.data.path else ''}); prompt budget "
             f"{exp.rollout.max_prompt_len} tokens"
             + (f" (rollout.max_prompt_len={summary['prompt_budget']['rule']}; the longest prompt has "
                f"{summary['prompt_budget']['longest']} tokens)" if summary.get("prompt_budget", {}).get("rule", "set")
                != "set" else "")
             + f", {exp.rollout.max_new_tokens} completion tokens, training rows of {plan.seq_len} tokens; prompts "
             f"dropped as longer than the prompt budget: {summary.get('dropped_long_prompts', {}).get('train', 0)} "
             f"train, {summary.get('dropped_long_prompts', {}).get('val', 0)} validation.",
             "- Generators: " + (f"SGLang-API fleet ({summary.get('generator_devices', 0)} generator devices "
                                  f"counted in compute beside {summary.get('trainer_devices', 1)} trainer devices; "
                                  f"{summary.get('weight_pushes', 0)} weight pushes, last one "
                                  f"{summary.get('weight_sync_bytes', 0) / 1e6:.1f} MB)."
                                  if summary.get("generator_devices") else "the embedded JAX engine (in process)."),
             f"- RL: {summary['steps']} steps in {summary['wall_seconds']:.0f}s wall; compute "
             f"{summary['device_hours']:.4f} device-hours; {summary['gen_tokens']} generated tokens.",
             f"- Trainer busy {summary['trainer_busy_fraction']:.0%}, generator busy "
             f"{summary['generator_busy_fraction']:.0%} of the RL wall time"
             + (" (they share the CPU)." if not summary.get("generator_devices") else "."),
             f"- Filtered zero-variance groups: {summary['filtered_groups']}; prompts removed by No-Positive-"
             f"Resampling: {summary['npr']['n_removed']}; skipped steps: {summary['skipped_steps']}; batches dropped "
             f"as too stale: {summary['dropped_stale_batches']}.", ""]
    if len(summary.get("tasks", {})) > 1:
        at = next(i for i, line in enumerate(lines) if line.startswith("- Generators: "))
        lines.insert(at, "- Tasks: " + "; ".join(f"{t} {v['n_train']} train / {v['n_val']} validation prompts, "
                                            f"{v['weight']:.0%} of each batch" for t, v in summary["tasks"].items())
                     + ".")
    if summary.get("sandbox"):
        sb = summary["sandbox"]
        lines.insert(-1, f"- Code sandbox: {sb.get('describe', sb['isolation'])} (sandbox.isolation="
                         f"{sb['configured']!r})" + (f"; {sb['runs']['runs']} programs run, "
                                                     f"{sb['runs'].get('timeout', 0)} timeouts, "
                                                     f"{sb['runs']['sandbox_error']} sandbox errors."
                                                     if "runs" in sb else "."))
    if evals:
        keys = ["val_reward", *sorted({k for e in evals for k in e if k.startswith("val_reward_")})]
        names = {k: "all" if k == "val_reward" else k[len("val_reward_"):] for k in keys}
        lines += ["## Validation reward (mean pass rate)", ""]
        for k in keys:
            r0, r1 = evals[0].get(k, float("nan")), evals[-1].get(k, float("nan"))
            best = max(e.get(k, float("nan")) for e in evals)
            lines.append(f"- {names[k] if len(keys) > 1 else 'Validation'}: start {r0:.3f} -> end {r1:.3f} "
                         f"({(r1 - r0) * 100:+.1f} points); best {best:.3f}.")
        lines += ["", "| step | device-hours | " + " | ".join(f"val reward ({names[k]})" if len(keys) > 1
                                                             else "val reward" for k in keys) + " |",
                  "|---|---|" + "---|" * len(keys)]
        lines += [f"| {e['step']} | {e['device_hours']:.5f} | "
                  + " | ".join(f"{e.get(k, float('nan')):.3f}" for k in keys) + " |" for e in evals]
        lines.append("")
    if fit_summary and "runs" in fit_summary:
        from scalerl_jax.scaling.report import held_text, interval_text, trust_lines

        for name, e in fit_summary["runs"].items():
            b = e["bayes"]["summary"] if "summary" in e["bayes"] else e["bayes"]
            p = e["prediction"]
            what = e.get("reward_key", "val_reward")
            part = ("all" if fit_summary.get("settings", {}).get("fit_until") == 1.0 else "first half") + " of compute"
            key = e.get("compute_key", "device_hours")
            lines += [f"## Scaling fit of {'val_reward' if what == 'val_reward' else what} (`{name}`, {part})", "",
                      f"Fitted on {e['n_fit']} eval points up to {_compute(e['fit_until_compute'], key)}.", ""]
            for k in ("A", "B", "C_mid"):
                if k in b:
                    s = b[k]
                    lines.append(f"- {k}: mean {s['mean']:.4g}, 90% interval [{s['lo']:.4g}, {s['hi']:.4g}]")
            lines += ["", f"Predicted reward at {_compute(e['target_compute'], key)}: {p['mean']:.3f} "
                      f"({interval_text(p)}); grid fit {p['grid']:.3f}."]
            if "held_out" in e:
                h = e["held_out"]
                lines.append(f"Measured at the end: {h['observed_nearest_target']:.3f}; error "
                             f"{h['error_nearest_target']:+.3f}; {held_text(h)}.")
            lines += trust_lines(e)
            lines += ["", "Plots and the fit's own report: `fit/` (fit_*.png, A_posteriors.png, efficiency.png).", ""]
    elif fit_summary:
        lines += ["## Scaling fit", "", f"The fit failed: {fit_summary.get('error')}", ""]
    lines += forecast_lines(summary)
    (run_dir / "report.md").write_text("\n".join(lines))


def _compute(c: float, key: str) -> str:
    """A compute value with its unit, for report.md (device-hours are small numbers on a CPU run; FLOPs large)."""
    return f"{c:.5f} device-hours" if key == "device_hours" else f"{c:.4g} {key}"


def forecast_lines(summary: dict) -> list[str]:
    """report.md's section on the live forecast: how it moved, the baseline comparison, an early stop's reason."""
    h, f = summary.get("forecast_history"), summary.get("forecast") or {}
    lines = []
    if summary.get("stopped_early"):
        lines += ["## Stopped early", "", f"The run {summary['stopped_early']}.", ""]
    if not h:
        return lines
    lines += ["## The forecast while it ran", "",
              f"{h['n']} refits of the law on every eval so far (refit process: {f.get('fit_seconds', 0):.0f}s, "
              f"{f.get('share_of_wall', 0):.1%} of the RL wall time"
              + (f"; {f['fit_cpu_seconds']:.0f}s of CPU, {f['cpu_share']:.1%}" if "cpu_share" in f else "")
              + f"; {f.get('skipped_for_budget', 0)} evals' refits skipped for the budget). Last forecast: A "
              f"{h['A_mean'][-1]:.3f} [{h['A_lo'][-1]:.3f}, {h['A_hi'][-1]:.3f}], predicted final reward "
              f"{h['R_target_mean'][-1]:.3f} [{h['R_target_lo'][-1]:.3f}, {h['R_target_hi'][-1]:.3f}] at "
              f"{h['target_compute'][-1]:.4g}."]
    if h.get("final_reward") is not None:
        held = (f"every forecast from {h['held_from_compute']:.4g} on ({h['held_from_fraction']:.0%} of the run's "
                "compute) held it in its 90 % interval of the final eval's measured value" if
                h.get("held_from_compute") is not None else "the last forecast's 90 % interval of the final eval's "
                f"measured value, [{h['R_obs_lo'][-1]:.3f}, {h['R_obs_hi'][-1]:.3f}], did not hold it")
        lines.append(f"Observed final reward {h['final_reward']:.3f} at {h['final_compute']:.4g}: {held}.")
    if summary.get("forecast_baseline"):
        b = summary["forecast_baseline"]
        lines.append(f"Against the baseline `{b['dir']}` (A {b['baseline_A_mean']:.3f}): P(A > A_baseline) = "
                     f"{b['P_A_gt_baseline']:.3f}, P(B > B_baseline) = {b['P_B_gt_baseline']:.3f} "
                     f"(rule: {b['baseline_rule']}).")
    lines += ["", "![forecast](fit/forecast.png)", ""]
    return lines


def forecast_report(run_dir: Path, summary: dict, log=print) -> None:
    """The live forecast's history into ``summary`` ("forecast_history", "forecast_baseline") and its figure into
    ``run_dir/fit/forecast.png``."""
    from scalerl_jax.metrics import read_metrics
    from scalerl_jax.scaling.forecast import forecast_history

    rows = read_metrics(run_dir)
    forecasts = [r for r in rows if r.get("kind") == "forecast"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not forecasts:
        return
    key = forecasts[-1].get("compute_key", "device_hours")
    last = evals[-1] if evals else {}
    h = forecast_history(forecasts, last.get(key), last.get("val_reward"))
    summary["forecast_history"] = h
    if "P_A_gt_baseline" in forecasts[-1]:
        f = forecasts[-1]
        summary["forecast_baseline"] = {"dir": summary.get("baseline_dir"), **{
            k: f[k] for k in ("baseline_A_mean", "P_A_gt_baseline", "P_B_gt_baseline", "baseline_rule")}}
    try:
        from scalerl_jax.scaling.plots import plot_forecast, save

        save(plot_forecast(h, compute_label=key), run_dir / "fit", "forecast")
    except Exception as e:  # noqa: BLE001 -- a figure is never a reason to lose the run's summary
        log(f"[run] forecast figure failed: {type(e).__name__}: {e}")


# ---- a study's comparison ----------------------------------------------------------------------------------


def variant_seed(run_dir) -> tuple[str, str]:
    """``dapo_s1`` -> ("dapo", "1"): a study's run directories are named ``<variant>_s<seed>``."""
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
        variant, seed = variant_seed(name)
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
        ref = f"{reference}_s{variant_seed(name)[1]}"
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
        lines += _another_seed_table(runs, {n: loaded[n] for n in runs if n in loaded}, posteriors, fit_until)
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
    the mean |error| over its seeds, how many last evals the 90 % interval of one eval covered (the mean curve's
    interval plus the eval's own noise), and the mean width of A's 90 % interval."""
    lines = ["", f"## Prediction from the first {fit_until:.0%} of compute (`{compute_key}`)", "",
             "| run | predicted end (90% interval of one eval) | observed | error | covered | A 90% width |",
             "|---|---|---|---|---|---|"]
    per_variant: dict[str, list] = {}
    for name, e in runs.items():
        if "held_out" not in e:
            continue
        p, h = e["prediction"], e["held_out"]
        a = e["bayes"].get("summary", e["bayes"])["A"]
        err, width = h["error_nearest_target"], a["hi"] - a["lo"]
        lo, hi = (p["eval_lo"], p["eval_hi"]) if "eval_lo" in p else (p["lo"], p["hi"])
        covered = h.get("inside_nearest_target", lo <= h["observed_nearest_target"] <= hi)
        per_variant.setdefault(variant_seed(name)[0], []).append((abs(err), covered, width))
        lines.append(f"| {name} | {p['mean']:.3f} [{lo:.3f}, {hi:.3f}] | {h['observed_nearest_target']:.3f} "
                     f"| {err:+.3f} | {'yes' if covered else 'no'} | {width:.3f} |")
    lines += ["", "| variant | seeds | mean abs error | covered | mean A 90% width |", "|---|---|---|---|---|"]
    for v, rows in per_variant.items():
        errs, cov, widths = zip(*rows)
        lines.append(f"| {v} | {len(rows)} | {sum(errs) / len(rows):.3f} | {sum(cov)}/{len(rows)} | "
                     f"{sum(widths) / len(rows):.3f} |")
    return lines


def _another_seed_table(runs: dict, curves: dict, posteriors: dict, fit_until: float) -> list[str]:
    """Where another seed of a recipe would end: for a variant with two or more fitted seeds, the pooled fit of the
    seeds' fit windows (``trust.another_seed``, scaling/seeds.py) gives a new seed's 90 % interval of one eval at
    the end; each seed is checked against the band the other seeds' pooled fit gives at its own last compute."""
    from scalerl_jax.scaling.io import fit_window
    from scalerl_jax.scaling.trust import another_seed

    by_variant: dict[str, list[str]] = {}
    for name in runs:
        if name in curves and name in posteriors:
            by_variant.setdefault(variant_seed(name)[0], []).append(name)
    by_variant = {v: names for v, names in by_variant.items() if len(names) >= 2}
    if not by_variant:
        return []
    lines = ["", "## Where another seed would end", "",
             f"The seeds' first {fit_until:.0%} fitted together, each seed's law drawn around the recipe's: a new "
             "seed's 90 % interval of one eval at the seeds' last compute; then each seed left out in turn, its last "
             "eval held against the band the other seeds' pooled fit gives at its compute.", "",
             "| recipe / seed left out | a new seed's end (90%) | its last eval | inside |", "|---|---|---|---|"]
    for variant, names in by_variant.items():
        try:
            res = another_seed({n: curves[n] for n in names}, {n: fit_window(curves[n], fit_until)[0] for n in names})
        except ValueError as e:  # e.g. seeds with and without eval sizes
            lines.append(f"| {variant} (seeds {', '.join(variant_seed(n)[1] for n in names)}) | not estimated: {e} "
                         "| | |")
            continue
        p = res["pooled"]
        lines.append(f"| {variant}: {len(names)} seeds pooled | [{p['band'][0]:.3f}, {p['band'][1]:.3f}] | | |")
        for n, r in res["runs"].items():
            lines.append(f"| {n} left out | [{r['band'][0]:.3f}, {r['band'][1]:.3f}] | {r['final']:.3f} | "
                         f"{'yes' if r['inside'] else 'no'} |")
    return lines


def _seed_average(runs: dict, posteriors: dict, out: Path, reference: str) -> dict:
    """``over_seeds`` on the fitted runs' posterior draws, when some recipe has more than one seed; draws
    ``A_over_seeds.png`` (each recipe's seed-averaged ceiling, one shared axis)."""
    import types

    from scalerl_jax.scaling.compare import over_seeds
    from scalerl_jax.scaling.plots import plot_A_posteriors, save

    by_recipe: dict[str, dict[str, dict]] = {}
    for name in runs:
        variant, seed = variant_seed(name)
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

