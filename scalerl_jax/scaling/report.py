"""Fit one or several runs end to end: read metrics.jsonl, fit the first part of each curve, predict the rest,
write summary.json, the plots and a short markdown report. ``fit_runs`` is what the CLI and experiments call."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np

from .bayes import fit_bayes_batch
from .compare import A_MARGIN, compare_at_shared_A, pairwise_table
from .grid import fit_grid
from .io import TASK_PREFIX, RunCurve, fit_window, load_run, task_keys
from .plots import markdown_table, plot_A_posteriors, plot_efficiency, plot_fit, plot_table, save
from .powerlaw import fit_power_law
from .trust import a_bound, departure, predictive_band

__all__ = ["fit_runs"]


def _unique_names(curves: list[RunCurve]) -> None:
    seen = {}
    for c in curves:
        if c.name in seen:
            seen[c.name] += 1
            c.name = f"{c.name}_{seen[c.name]}"
        else:
            seen[c.name] = 0


def _bayes_inputs(curve: RunCurve, mask: np.ndarray, exclude_below: float) -> dict:
    """Data and R0 choice for fit_bayes: R0 is fitted when the window keeps the step-0 point (it pins R0),
    otherwise fixed to the first observed reward, as the paper does."""
    keep = mask & (curve.compute >= exclude_below)
    d = {"compute": curve.compute[keep], "reward": curve.reward[keep]}
    if not np.any(d["compute"] == 0):
        d["R0"] = float(curve.reward[0])
    if curve.val_n is not None:
        d["n_prompts"], d["k_samples"] = curve.val_n[keep], curve.val_k[keep]
    return d


def _caught(fn, *args, sink: list, **kwargs):
    """Run ``fn``; record its warnings in ``sink`` for the report and re-emit them for the caller."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    for w in rec:
        sink.append(str(w.message))
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out


def _load_curves(run_dirs, compute_key: str, per_task: bool = True) -> list[RunCurve]:
    """Read every run's eval curve; names made unique (a second ``run`` becomes ``run_1``). With ``per_task``, a
    multi-task run (eval rows with ``val_reward_<task>``) adds one curve per task, named ``<run>_<task>``, after
    its combined curve: the paper fits a math+code run's math and code curves separately. A RunCurve given in
    ``run_dirs`` (another trainer's log, read by scaling.sources) is taken as it is."""
    run_dirs = [run_dirs] if isinstance(run_dirs, (str, Path, RunCurve)) else list(run_dirs)
    if not run_dirs:
        raise ValueError("fit_runs: no run directories given")
    curves = []
    for d in run_dirs:
        if isinstance(d, RunCurve):
            curves.append(dataclasses.replace(d))  # a copy: names may be made unique below
            continue
        combined = load_run(d, compute_key=compute_key)
        curves.append(combined)
        for key in task_keys(d) if per_task else []:
            curves.append(load_run(d, compute_key=compute_key, name=f"{combined.name}_{key[len(TASK_PREFIX):]}",
                                   reward_key=key))
    _unique_names(curves)
    return curves


def _window(curve: RunCurve, fit_until: float, fit_until_compute: float | None, excl: float):
    """The run's fit window: (mask of fitted points, compute limit); refuses a window with fewer than 5 points."""
    mask, limit = fit_window(curve, fit_until, fit_until_compute)
    n_fit = int(np.sum(mask & (curve.compute >= excl)))
    if n_fit < 5:
        raise ValueError(
            f"fit_runs: run {curve.name!r} has {n_fit} eval points in its fit window (compute <= {limit:g}, "
            f">= {excl:g}); need at least 5, fit on more of the run"
        )
    return mask, limit


def _fit_posteriors(inputs: dict, notes: dict, *, seed, num_samples, num_chains, num_warmup) -> dict:
    """fit_bayes on every run's window: {name: SigmoidPosterior}; each run's fit warnings go to ``notes[name]``.

    Runs whose model variants agree (R0 fixed or fitted, counts or not) share one vectorised NUTS run, so one
    compilation serves them all.
    """
    groups = {}
    for name, d in inputs.items():
        groups.setdefault(tuple(sorted(d)), []).append(name)
    posteriors = {}
    for names in groups.values():
        sink = []
        posts = _caught(fit_bayes_batch, [inputs[n] for n in names], seed=seed, num_samples=num_samples,
                        num_chains=num_chains, num_warmup=num_warmup, sink=sink)
        for n, p in zip(names, posts):
            posteriors[n] = p
            tag = f"fit_bayes_batch[{names.index(n)}]"
            notes[n] += [m.replace(tag, "fit_bayes") for m in sink if m.startswith(tag)]
    return posteriors


def _eval_sizes(curve: RunCurve, idx) -> np.ndarray | None:
    """val_n x val_k of the evals at ``idx`` (None when the run's eval rows do not carry them)."""
    return None if curve.val_n is None else (curve.val_n * curve.val_k)[idx]


def _held_out(curve: RunCurve, held: np.ndarray, post, target: float) -> dict:
    """How the prediction fares on the evals after the fit window (the paper's check of the extrapolation).

    An eval is the mean curve plus its own noise, so each is held against the 90 % predictive interval of one eval
    (``fraction_in_90``; trust.predictive_band at the eval's own val_n x val_k); ``fraction_in_90_mean_curve`` is
    the share inside the mean curve's band, which is too narrow for single evals by construction."""
    c = curve.compute[held]
    pm, plo, phi = post.predict(c)
    elo, ehi = predictive_band(post, c, nk=_eval_sizes(curve, held))
    obs = curve.reward[held]
    last = int(np.argmin(np.abs(c - target)))
    inside = (obs >= elo) & (obs <= ehi)
    return {
        "n": int(held.sum()),
        "mean_abs_error": float(np.mean(np.abs(obs - pm))),
        "fraction_in_90": float(np.mean(inside)),
        "fraction_in_90_mean_curve": float(np.mean((obs >= plo) & (obs <= phi))),
        "compute_nearest_target": float(c[last]),
        "observed_nearest_target": float(obs[last]),
        "predicted_nearest_target": float(pm[last]),
        "error_nearest_target": float(obs[last] - pm[last]),
        "eval_interval_nearest_target": [float(elo[last]), float(ehi[last])],
        "inside_nearest_target": bool(inside[last]),
    }


def _fit_run(curve: RunCurve, window, post, notes: list, *, excl: float, target_compute):
    """The point fits (grid, power law) of one run beside its posterior, and its summary.json entry.

    Returns (entry, grid fit, power-law fit or None, target compute). The fits' warnings are appended to
    ``notes``; a power law that cannot be fitted is a note, not an error.
    """
    mask, limit = window
    c_fit, r_fit = curve.compute[mask], curve.reward[mask]
    grid = _caught(fit_grid, c_fit, r_fit, float(curve.reward[0]), exclude_below=excl, sink=notes)
    try:
        power = _caught(fit_power_law, c_fit, r_fit, exclude_below=excl, sink=notes)
    except (ValueError, RuntimeError) as e:
        power = None
        notes.append(f"power law not fitted: {e}")
    held = ~mask
    target = float(target_compute) if target_compute else (
        float(curve.compute.max()) if np.any(held) else 2.0 * limit)
    mean_t, lo_t, hi_t = (float(v[0]) for v in post.predict([target]))
    # one eval at the target, as large as the run's last: what a measured end is held against
    last_nk = _eval_sizes(curve, [-1])
    eval_lo, eval_hi = (float(v[0]) for v in predictive_band(post, [target], nk=last_nk))
    entry = {
        "path": curve.path,
        "compute_key": curve.compute_key,
        "reward_key": curve.reward_key,
        "n_points": int(curve.compute.size),
        "n_fit": int(np.sum(mask & (curve.compute >= excl))),
        "fit_until_compute": limit,
        "target_compute": target,
        "prediction": {"mean": mean_t, "lo": lo_t, "hi": hi_t, "eval_lo": eval_lo, "eval_hi": eval_hi,
                       "grid": float(grid.predict(target)),
                       "power_law": None if power is None else float(power.predict(target))},
        "bayes": post.to_dict(),
        "grid": grid.to_dict(),
        "power_law": None if power is None else power.to_dict(),
        "warnings": notes,
        # how far to trust it: A's upper end at the prior's bound, and the first later eval off the fitted law
        "trust": {"A": a_bound(post), "departure": departure(curve, mask, post)},
    }
    if np.any(held):
        entry["held_out"] = _held_out(curve, held, post, target)
    return entry, grid, power, target


def _compare(posteriors: dict, *, seed, num_samples, num_chains) -> tuple[list, list]:
    """Pairwise posterior comparisons of the runs and, for up to 4 runs, the paper's rule for every pair
    (A first; B at a shared A when the ceilings agree). Both lists are empty for a single run."""
    pairwise = pairwise_table(posteriors) if len(posteriors) > 1 else []
    shared = []
    if 1 < len(posteriors) <= 4:
        names = list(posteriors)
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                p1, p2 = posteriors[names[i]], posteriors[names[j]]
                res = compare_at_shared_A(p1, p2, seed=seed, num_samples=num_samples, num_chains=num_chains)
                shared.append({"run_1": names[i], "run_2": names[j]} | res)
    return pairwise, shared


def _plot_overview(curves: list[RunCurve], posteriors: dict, pairwise: list, out: Path) -> list:
    """The figures over all runs (A posteriors, efficiency, parameter table); returns the files written."""
    figures = save(plot_A_posteriors(posteriors), out, "A_posteriors")
    figures += save(plot_efficiency({c.name: (c, posteriors[c.name]) for c in curves}), out, "efficiency")
    figures += save(plot_table(posteriors, pairwise), out, "table")
    return figures


def fit_runs(
    run_dirs,
    out_dir,
    fit_until: float = 0.5,
    target_compute: float | None = None,
    exclude_below: float | None = None,
    *,
    fit_until_compute: float | None = None,
    compute_key: str = "device_hours",
    seed: int = 0,
    num_samples: int = 1000,
    num_chains: int = 4,
    num_warmup: int | None = None,
    make_plots: bool = True,
    per_task: bool = True,
    posteriors_out: dict | None = None,
) -> dict:
    """Fit each run's eval curve on its first ``fit_until`` fraction of compute (or up to ``fit_until_compute``),
    predict the reward at ``target_compute`` and compare runs; write summary.json, plots and report.md.

    Args:
        run_dirs: run directories (each with metrics.jsonl), metrics.jsonl paths, or RunCurve objects (curves
            read from other trainers' logs by scaling.sources: CSV, TensorBoard, W&B).
        out_dir: where summary.json, report.md and the PNG/SVG figures go.
        target_compute: compute to predict at; default the run's last eval when it ran past the fit window,
            else twice the window (the paper's protocol: fit on half, predict the whole).
        exclude_below: drop points below this compute from every fit (the paper's first ~1.5k GPU-h).
        compute_key: eval-row column of the run directories used as compute ("device_hours" or "flops"); a
            RunCurve keeps its own.
        per_task: also fit each task's curve of a multi-task run (``val_reward_<task>``), as ``<run>_<task>``.
        posteriors_out: a dict to receive every fit's SigmoidPosterior by curve name (its draws, for comparisons
            beyond the pairwise table, e.g. experiments.loo's seed averages).
        seed, num_samples, num_chains, num_warmup: NUTS settings for fit_bayes.
    Returns the summary dict written to summary.json.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    excl = float(exclude_below or 0.0)
    curves = _load_curves(run_dirs, compute_key, per_task)
    windows = {c.name: _window(c, fit_until, fit_until_compute, excl) for c in curves}
    inputs = {c.name: _bayes_inputs(c, windows[c.name][0], excl) for c in curves}
    notes = {c.name: [] for c in curves}
    posteriors = _fit_posteriors(inputs, notes, seed=seed, num_samples=num_samples, num_chains=num_chains,
                                 num_warmup=num_warmup)
    if posteriors_out is not None:
        posteriors_out.update(posteriors)

    runs, figures = {}, []
    for curve in curves:
        name = curve.name
        runs[name], grid, power, target = _fit_run(curve, windows[name], posteriors[name], notes[name], excl=excl,
                                                   target_compute=target_compute)
        if make_plots:
            fig = plot_fit(curve, posteriors[name], windows[name][1], target, grid_fit=grid, power_fit=power,
                           compute_label=curve.compute_key)
            figures += save(fig, out, f"fit_{name}")

    # runs are compared on their combined curves (a run's task curves are parts of it, not rivals)
    combined = {c.name: posteriors[c.name] for c in curves if not c.reward_key.startswith(TASK_PREFIX)}
    pairwise, shared = _compare(combined, seed=seed, num_samples=num_samples, num_chains=num_chains)
    if make_plots:
        figures += _plot_overview(curves, posteriors, pairwise, out)
    summary = {
        "settings": {"fit_until": fit_until, "fit_until_compute": fit_until_compute, "target_compute": target_compute,
                     "exclude_below": excl, "compute_key": compute_key, "seed": seed, "num_samples": num_samples,
                     "num_chains": num_chains},
        "runs": runs,
        "pairwise": pairwise,
        "paper_rule": shared,
        "figures": figures,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    (out / "report.md").write_text(_markdown(summary, posteriors, pairwise))
    return summary


def interval_text(p: dict) -> str:
    """The prediction's two 90 % intervals in words: the mean curve's, and one eval's (the curve plus the eval's own
    noise: what a measured value is held against); summaries written before the eval interval existed have only
    the first."""
    if "eval_lo" not in p:
        return f"90 % interval of the mean curve {p['lo']:.3f} to {p['hi']:.3f}"
    return (f"90 % interval of the mean curve {p['lo']:.3f} to {p['hi']:.3f}; of one eval there, with its own "
            f"noise, {p['eval_lo']:.3f} to {p['eval_hi']:.3f}")


def held_text(h: dict) -> str:
    """How the held-out evals fared, in words (each against its own eval's 90 % predictive interval)."""
    if "inside_nearest_target" not in h:  # a summary written before the eval intervals
        return (f"over {h['n']} held-out evals mean |error| {h['mean_abs_error']:.3f}, "
                f"{100 * h['fraction_in_90']:.0f} % inside the mean curve's 90 % band")
    return (f"{'inside' if h['inside_nearest_target'] else 'outside'} the 90 % interval of one eval there; over "
            f"{h['n']} held-out evals mean |error| {h['mean_abs_error']:.3f}, {100 * h['fraction_in_90']:.0f} % inside "
            f"their evals' 90 % intervals ({100 * h['fraction_in_90_mean_curve']:.0f} % inside the narrower band of "
            "the mean curve)")


def trust_lines(e: dict) -> list[str]:
    """What the report says of the fit's trust (scaling/trust.py): A's interval at the prior's bound, and the first
    later eval where the run left its fitted law."""
    t = e.get("trust") or {}
    lines = []
    a = t.get("A")
    if a and a["at_bound"]:
        lines.append(f"A's 90 % interval [{a['lo']:.3f}, {a['hi']:.3f}] runs up to the prior's bound (A <= "
                     f"{a['bound']:g}, a pass rate's maximum): its upper end is the bound, not the data, which pin "
                     f"only the lower end, A >= {a['lo']:.3f}.")
    d = t.get("departure")
    if d and d["step"] is not None:
        lines.append(f"**The run left its fitted law at step {d['step']}** ({e['compute_key']} = {d['compute']:.4g}): "
                     f"{d['reason']}; {d['outside']} of {d['n_held']} later evals lie outside the predictive band. "
                     "The extrapolation past that point is not to be trusted.")
    return lines


def _markdown(summary: dict, posteriors: dict, pairwise: list) -> str:
    """report.md: per run the fit window, the prediction, how it held up on later evals and the diagnostics;
    then the parameter table and the paper's comparison rule for every pair."""
    lines = ["# Scaling fit report", ""]
    for name, e in summary["runs"].items():
        p, compute_key = e["prediction"], e["compute_key"]
        lines.append(f"## {name}")
        lines.append("")
        lines.append(
            f"Fitted on {e['n_fit']} eval points up to {compute_key} = {e['fit_until_compute']:.4g}. "
            f"Predicted validation reward at {compute_key} = {e['target_compute']:.4g}: **{p['mean']:.3f}** "
            f"({interval_text(p)}); grid fit {p['grid']:.3f}"
            + (f", power law {p['power_law']:.3f}." if p["power_law"] is not None else ".")
        )
        if "held_out" in e:
            h = e["held_out"]
            lines.append(
                f"The run continued: at {compute_key} = {h['compute_nearest_target']:.4g} it measured "
                f"{h['observed_nearest_target']:.3f}, prediction error (observed - predicted) "
                f"{h['error_nearest_target']:+.3f}, {held_text(h)}."
            )
        else:
            lines.append("The run stops at the fit window: no held-out evals to check the prediction against.")
        lines += trust_lines(e)
        b = e["bayes"]
        lines.append(
            f"Diagnostics: max r_hat {max(b['r_hat'].values(), default=float('nan')):.3f}, min ESS "
            f"{min(b['ess'].values()):.0f}, {b['num_divergences']} divergences, likelihood {b['likelihood']}."
        )
        if e["warnings"]:
            lines += ["", "Warnings:"] + [f"- {w}" for w in e["warnings"]]
        lines += ["", f"![fit](fit_{name}.png)", ""]
    lines += ["## Parameters (posterior mean [90 % interval])", "", markdown_table(posteriors, pairwise)]
    for s in summary["paper_rule"]:
        if s["rule"] == "A":
            lines.append(f"- {s['run_1']} vs {s['run_2']}: A differs by {s['dA_mean']:+.3f} (> {A_MARGIN}); "
                         f"P(A1 > A2) = {s['P_A1_gt_A2']:.3f}; better: {s['run_' + str(s['better'])]}.")
        else:
            lines.append(f"- {s['run_1']} vs {s['run_2']}: A within {A_MARGIN}; at shared A = {s['A_shared']:.3f}, "
                         f"B = {s['B1_at_shared_A']:.2f} vs {s['B2_at_shared_A']:.2f}, P(B1 > B2) = "
                         f"{s['P_B1_gt_B2_at_shared_A']:.3f}; better: {s['run_' + str(s['better'])]}.")
    lines += ["", "![A posteriors](A_posteriors.png) ![efficiency](efficiency.png)", ""]
    return "\n".join(lines)

