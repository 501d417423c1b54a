"""The calibration study: how often the first half's intervals hold the rest of a run, over every stored run.

    python -m benchmarks.calibration                       # every run under results/ (a folder with metrics.jsonl)
    python -m benchmarks.calibration results/calibration_tiny runs/my_run --json study.json
    python -m benchmarks.calibration results --held-out results/calibration_tiny_heldout

Each run is fitted on its first ``--fit-until`` of compute (``fit_runs``, the path of ``scalerl_jax.fit`` and the run's
own report) and its later evals are held against three 90 % intervals:

- **mean curve**: the posterior of the law's mean curve at the eval's compute (``post.predict``): what the reports
  before this study compared held-out evals with. An eval is the curve plus its own noise, so this band is too
  narrow for evals by construction.
- **eval**: the posterior predictive of one eval (``trust.predictive_band``): the mean curve's draws plus the eval's
  noise from the fit's own likelihood (over-dispersed binomial at ``val_n x val_k``, dispersion fitted).
- **another seed** (recipes with 2 or more seeds in the study): the band of one eval of a new seed, from the pooled
  fit of the recipe's *other* seeds' first halves (``trust.another_seed``, scaling/seeds.py), checked against the
  left-out seed's final eval: it answers "where would another seed of this recipe end".

Where misses come from, per run: the eval noise (binomial sd at the final eval; the fitted over-dispersion), drift
between evals (lag-1 autocorrelation of the held-out evals' standardised residuals, and misses that come in runs on
one side), the law's shape late in the run (the signed error growing over the second half), the prior's bound (A's
interval ending at 1) and a departure from the law (``trust.departure``). Runs are grouped into recipes by folder and
name without the ``_s<seed>`` suffix. Fits run in one vectorised NUTS batch: minutes for a few dozen runs on 2 cores.

The pooled table has a row per study folder and one for all runs; ``--held-out FOLDER ...`` names the folders whose
runs were made after the model and its settings were fixed and played no part in choosing them (they are studied
with the rest, and pooled again on their own line): coverage on those is the study's unbiased measure.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from scalerl_jax.scaling.io import fit_window, load_run
from scalerl_jax.scaling.report import fit_runs
from scalerl_jax.scaling.trust import a_bound, another_seed, departure, predictive_band

INTERVAL = 0.9
SEED_SUFFIX = re.compile(r"_s(\d+)$")


def find_runs(roots: list[Path]) -> list[Path]:
    """Every folder under ``roots`` holding a metrics.jsonl (a root may be a run itself); ``superseded`` skipped."""
    runs = []
    for root in roots:
        if (root / "metrics.jsonl").is_file():
            runs.append(root)
            continue
        if not root.is_dir():
            raise FileNotFoundError(f"calibration: {root} is neither a run (metrics.jsonl) nor a folder of runs")
        runs += sorted(p.parent for p in root.rglob("metrics.jsonl") if "superseded" not in p.parts)
    return runs


def recipe_of(run: Path) -> str:
    """``<parent>/<name without _s<seed>>``: the runs of one study's recipe, seeds apart."""
    return f"{run.parent.name}/{SEED_SUFFIX.sub('', run.name)}"


def _runs_of_signs(side: np.ndarray) -> np.ndarray:
    """For each miss (side != 0), whether a neighbouring eval missed on the same side (a run of misses)."""
    same_prev = np.r_[False, (side[1:] == side[:-1]) & (side[1:] != 0)]
    same_next = np.r_[same_prev[1:], False]
    return (side != 0) & (same_prev | same_next)


def _lag1(x: np.ndarray) -> float:
    if x.size < 3 or np.std(x) == 0:
        return float("nan")
    return float(np.corrcoef(x[:-1], x[1:])[0, 1])


def study_run(curve, mask, post) -> dict:
    """One run's row: coverage of its held-out evals by each interval, its final eval, and where misses come from."""
    held = np.flatnonzero(~mask)
    c, r = curve.compute[held], curve.reward[held]
    nk = (curve.val_n * curve.val_k)[held] if curve.val_n is not None else None
    mean, mlo, mhi = post.predict(c, interval=INTERVAL)
    elo, ehi = predictive_band(post, c, nk=nk, interval=INTERVAL)
    in_mean = (r >= mlo) & (r <= mhi)
    in_eval = (r >= elo) & (r <= ehi)
    side = np.where(r > ehi, 1, np.where(r < elo, -1, 0))
    err = r - mean
    # standardised by the eval's predictive spread (the band's half width over 1.645)
    z = err / np.maximum((ehi - elo) / (2 * 1.6449), 1e-9)
    dep = departure(curve, mask, post)
    dep_step = dep["step"]
    after_dep = np.array([dep_step is not None and s >= dep_step for s in curve.step[held]])
    in_runs = _runs_of_signs(side)
    n = r.size
    thirds = np.array_split(np.arange(n), 3)
    row = {
        "n_fit": int(mask.sum()), "n_held": int(n),
        "cover_mean": float(in_mean.mean()), "cover_eval": float(in_eval.mean()),
        "final": float(r[-1]), "final_pred": float(mean[-1]), "final_err": float(err[-1]),
        "final_in_mean": bool(in_mean[-1]), "final_in_eval": bool(in_eval[-1]),
        "width_mean": float(mhi[-1] - mlo[-1]), "width_eval": float(ehi[-1] - elo[-1]),
        "binomial_sd": float(np.sqrt(r[-1] * (1 - r[-1]) / nk[-1])) if nk is not None else None,
        "dispersion": float(np.median(post.samples["dispersion"])) if "dispersion" in post.samples else None,
        "lag1_z": _lag1(z),
        "late_bias": float(np.mean(err[thirds[-1]]) - np.mean(err[thirds[0]])) if n >= 3 else float("nan"),
        "A_at_bound": a_bound(post)["at_bound"],
        "departure_step": dep_step,
        "held_before_departure": int(np.sum(~after_dep)), "in_eval_before_departure": int(np.sum(in_eval & ~after_dep)),
        "misses": int(n - in_eval.sum()),
        "misses_after_departure": int(np.sum(~in_eval & after_dep)),
        "misses_in_runs": int(np.sum(in_runs & ~after_dep)),
        "misses_above": int(np.sum(side > 0)), "misses_below": int(np.sum(side < 0)),
    }
    return row


def run_study(roots: list[Path], *, fit_until: float = 0.5, compute_key: str = "flops", num_samples: int = 500,
              num_chains: int = 4, seed: int = 0) -> dict:
    runs = find_runs(roots)
    if not runs:
        raise SystemExit(f"calibration: no runs (folders with metrics.jsonl) under {', '.join(map(str, roots))}")
    names = {r: f"{r.parent.name}/{r.name}" for r in runs}
    curves = {r: load_run(r, compute_key=compute_key, name=names[r].replace("/", "__")) for r in runs}
    recipes: dict[str, list[Path]] = {}
    for r in runs:
        recipes.setdefault(recipe_of(r), []).append(r)
    t0 = time.perf_counter()
    posteriors = {}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_runs([curves[r] for r in runs], tmp, fit_until=fit_until, compute_key=compute_key, seed=seed,
                 num_samples=num_samples,
                 num_chains=num_chains, make_plots=False, per_task=False, posteriors_out=posteriors)
    rows = {}
    by_name = {curves[r].name: r for r in runs}
    for name, post in posteriors.items():
        r = by_name[name]
        mask, _ = fit_window(curves[r], fit_until)
        row = study_run(curves[r], mask, post)
        rows[names[r]] = {"recipe": recipe_of(r), **row}
    # another seed: the seeds of a recipe fitted together (trust.another_seed), each seed's last eval held against
    # the band of a new seed from the pooled fit of the *other* seeds' first halves
    for rec, members in recipes.items():
        if len(members) < 2:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = another_seed({m: curves[m] for m in members},
                                   {m: fit_window(curves[m], fit_until)[0] for m in members}, interval=INTERVAL,
                                   seed=seed, num_samples=num_samples, num_chains=num_chains)
        except ValueError as e:  # seeds with and without eval sizes
            print(f"[calibration] {rec}: another seed's interval not estimated: {e}", file=sys.stderr)
            continue
        for m, r in res["runs"].items():
            rows[names[m]].update(width_seed=r["width"], seed_band=r["band"], final_in_seed_band=r["inside"])
    fit_s = time.perf_counter() - t0
    return {"settings": {"fit_until": fit_until, "compute_key": compute_key, "num_samples": num_samples,
                         "num_chains": num_chains, "seed": seed, "roots": [str(x) for x in roots]},
            "fit_seconds": fit_s, "runs": rows, "pooled": pooled(rows)}


def pooled(rows: dict) -> dict:
    held = sum(r["n_held"] for r in rows.values())
    out = {
        "runs": len(rows), "held_out_evals": held,
        "cover_mean": sum(r["cover_mean"] * r["n_held"] for r in rows.values()) / held,
        "cover_eval": sum(r["cover_eval"] * r["n_held"] for r in rows.values()) / held,
        "finals_in_mean": sum(r["final_in_mean"] for r in rows.values()),
        "finals_in_eval": sum(r["final_in_eval"] for r in rows.values()),
        "cover_eval_before_departure": sum(r["in_eval_before_departure"] for r in rows.values())
        / max(sum(r["held_before_departure"] for r in rows.values()), 1),
        "misses": sum(r["misses"] for r in rows.values()),
        "misses_after_departure": sum(r["misses_after_departure"] for r in rows.values()),
        "misses_in_runs": sum(r["misses_in_runs"] for r in rows.values()),
    }
    held = [r for r in rows.values() if "final_in_seed_band" in r]
    if held:
        out["seeds_left_out"] = len(held)
        out["seeds_left_out_in"] = sum(r["final_in_seed_band"] for r in held)
    return out


def folder_of(name: str) -> str:
    """The study folder of a row (``<folder>/<run>``)."""
    return name.split("/", 1)[0]


def pooled_table(result: dict, held_out: list[str] = ()) -> str:
    """One pooled row per study folder, one over the folders held out of every choice (``held_out``), one over all."""
    rows = result["runs"]
    groups: dict[str, dict] = {}
    for name, r in rows.items():
        groups.setdefault(folder_of(name), {})[name] = r
    lines = ["| runs | held-out evals | in the mean curve's band | in one eval's interval | the same, before a run "
             "left its law | last evals inside (eval interval) | left-out seed's end inside a new seed's band |",
             "|---|---|---|---|---|---|---|"]

    def line(label: str, sub: dict) -> str:
        p = pooled(sub)
        before = sum(r["held_before_departure"] for r in sub.values())
        seeds = f"{p['seeds_left_out_in']} of {p['seeds_left_out']}" if "seeds_left_out" in p else "-"
        return (f"| {label} | {p['held_out_evals']} | {p['cover_mean']:.1%} | {p['cover_eval']:.1%} | "
                f"{p['cover_eval_before_departure']:.1%} ({before} evals) | {p['finals_in_eval']} of {p['runs']} | "
                f"{seeds} |")

    for folder, sub in groups.items():
        lines.append(line(f"{folder} ({len(sub)} runs){', held out' if folder in held_out else ''}", sub))
    if held_out:
        sub = {n: r for n, r in rows.items() if folder_of(n) in held_out}
        lines.append(line(f"**held out of every choice: {len(sub)} runs**", sub))
    lines.append(line(f"**all {len(rows)} runs**", rows))
    return "\n".join(lines) + "\n"


def markdown(result: dict, held_out: list[str] = ()) -> str:
    rows, p = result["runs"], result["pooled"]
    f = lambda x, d=3: "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{d}f}"  # noqa: E731
    lines = ["| run | fit / held | held in mean-curve band | held in eval band | final (pred) | error | "
             "final in eval band (width) | final in a new seed's band, other seeds pooled (width) | "
             "binomial sd | dispersion | lag-1 z | "
             "late bias | A at bound | left its law at | misses: in runs / after departure |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        seed = "-" if "final_in_seed_band" not in r else (
            f"{'yes' if r['final_in_seed_band'] else 'no'} ({f(r['width_seed'])} wide)")
        lines.append(
            f"| {name} | {r['n_fit']} / {r['n_held']} | {r['cover_mean']:.0%} | {r['cover_eval']:.0%} | "
            f"{f(r['final'])} ({f(r['final_pred'])}) | {r['final_err']:+.3f} | "
            f"{'yes' if r['final_in_eval'] else 'no'} ({f(r['width_eval'])}) | {seed} | {f(r['binomial_sd'])} | "
            f"{f(r['dispersion'], 2)} | {f(r['lag1_z'], 2)} | {r['late_bias']:+.3f} | "
            f"{'yes' if r['A_at_bound'] else 'no'} | {r['departure_step'] if r['departure_step'] is not None else '-'}"
            f" | {r['misses_in_runs']} / {r['misses_after_departure']} of {r['misses']} |")
    lines += ["", f"Pooled over {p['runs']} runs and {p['held_out_evals']} held-out evals: "
              f"{p['cover_mean']:.1%} inside the mean curve's 90 % band, **{p['cover_eval']:.1%} inside the eval's "
              f"90 % predictive band** ({p['cover_eval_before_departure']:.1%} of the evals before a run left its "
              f"law); final evals inside: {p['finals_in_mean']} of {p['runs']} (mean-curve band), "
              f"**{p['finals_in_eval']} of {p['runs']}** (eval band). Misses of the eval band: {p['misses']}, of which "
              f"{p['misses_in_runs']} next to another miss on the same side (drift) before any departure and "
              f"{p['misses_after_departure']} after the run left its law."]
    if "seeds_left_out" in p:
        lines.append(f"Another seed: {p['seeds_left_out_in']} of {p['seeds_left_out']} runs end inside the band of a "
                     "new seed from the pooled fit of their recipe's other seeds' first halves.")
    return "\n".join(lines) + "\n\n" + pooled_table(result, held_out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.calibration", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="*", type=Path, default=[Path("results")],
                    help="runs, or folders searched for runs (default: results/)")
    ap.add_argument("--fit-until", type=float, default=0.5, help="fraction of each run's compute fitted (0.5)")
    ap.add_argument("--compute-key", default="flops", choices=("flops", "device_hours"))
    ap.add_argument("--num-samples", type=int, default=500, help="NUTS draws per chain (500)")
    ap.add_argument("--held-out", type=Path, nargs="+", default=[], metavar="FOLDER",
                    help="study folders made after the model was fixed (studied too, and pooled on their own line)")
    ap.add_argument("--json", type=Path, default=None, help="write every row as JSON here")
    a = ap.parse_args(argv)
    for h in a.held_out:
        if not h.is_dir():
            ap.error(f"--held-out {h}: not a folder")
    roots = list(a.roots) + [h for h in a.held_out if all(h.resolve() != r.resolve() and r.resolve() not in
                                                          h.resolve().parents for r in a.roots)]
    res = run_study(roots, fit_until=a.fit_until, compute_key=a.compute_key, num_samples=a.num_samples)
    held = [h.resolve().name for h in a.held_out]
    res["held_out"] = held
    if a.held_out:
        sub = {n: r for n, r in res["runs"].items() if folder_of(n) in held}
        if not sub:
            ap.error(f"--held-out: no studied run lies in {', '.join(map(str, a.held_out))}")
        res["pooled_held_out"] = pooled(sub)
    print(markdown(res, held))
    print(f"[calibration] {len(res['runs'])} runs fitted in {res['fit_seconds']:.0f} s", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
