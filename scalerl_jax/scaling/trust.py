"""How far a first-half fit can be trusted: where A's interval is the prior's bound rather than the data, and
whether the run's later evals left the fitted law.

- **A at its bound.** A's prior is Uniform(R0, 1): a pass rate cannot exceed 1. When a run is still rising at the
  end of its fit window, the posterior of A runs up against 1 and the interval's upper end is the bound, not a
  measurement; the data pin only the lower end. :func:`a_bound` says which.
- **A run that left its law.** The posterior predictive band of each later eval (the mean curve's draws plus the
  eval noise of the fit's own likelihood: the counts model's over-dispersed binomial at the eval's ``val_n x
  val_k``, or the normal model's sigma) holds 90 % of the evals of a run that follows the law. A run left its law
  at the first of ``consecutive`` later evals in a row outside that band on the same side (above: it outgrew the
  fitted ceiling; below: it fell off its curve; 2 x 0.05^3 per eval by chance), or at an eval that fell
  below the run's best so far by more than the noise of two evals allows (``fall_z`` standard deviations, each eval
  counting its ``val_n`` prompts as its independent draws: wider than the binomial over ``val_n x val_k``, so a noisy
  curve does not set it off). :func:`departure` finds the first such eval; past it the extrapolation is not trusted.
- **Another seed.** Where a second seed of the same recipe would end: :func:`seed_spread` estimates the run-to-run
  spread from the seeds' fit windows alone, and :func:`another_seed` widens each run's interval of one eval by it and
  holds it against the other seeds' last evals (the run reports' table and the calibration study use it).
"""

from __future__ import annotations

import numpy as np

__all__ = ["a_bound", "another_seed", "departure", "predictive_band", "seed_spread"]

#: A's interval counts as ending at the prior's bound when its upper end lies within this fraction of the prior's
#: range (1 - R0) of 1
BOUND_TOL = 0.02


def _draws(post, name: str) -> np.ndarray:
    return np.asarray(post._param(name), dtype=float)


def predictive_band(post, compute, nk=None, interval: float = 0.9, seed: int = 0, max_samples: int = 4000,
                    seed_sd: float | None = None):
    """(lo, hi) of the posterior predictive of an eval at each ``compute``: the mean curve's draws plus one eval's
    noise from the fit's likelihood (``nk``: the eval's ``val_n x val_k``, needed by the counts likelihood).

    ``seed_sd``: the sd by which another seed's curve differs from this run's (:func:`seed_spread`); the band then
    answers where an eval of another seed of the recipe would lie, not one of this run."""
    c = np.atleast_1d(np.asarray(compute, dtype=float))
    mu = post.curves(c, max_samples=max_samples)
    m = mu.shape[0]
    idx = np.linspace(0, post.samples["A"].size - 1, m).astype(int)
    if post.likelihood == "counts":
        if nk is None:
            raise ValueError("predictive_band: the counts likelihood needs each eval's val_n x val_k (nk)")
        nk = np.broadcast_to(np.asarray(nk, dtype=float), c.shape)[None, :]
        disp = _draws(post, "dispersion")[idx, None]
        sd = np.sqrt(np.maximum(mu * (1.0 - mu), 1.0 / nk) / nk * disp)
    else:
        sd = _draws(post, "sigma")[idx, None] * np.ones_like(mu)
    rng = np.random.default_rng(seed)
    draws = mu + sd * rng.standard_normal(mu.shape)
    if seed_sd:
        draws = draws + float(seed_sd) * rng.standard_normal(mu.shape)
    q = (1.0 - interval) / 2.0
    return np.quantile(draws, q, axis=0), np.quantile(draws, 1.0 - q, axis=0)


def a_bound(post, tol: float = BOUND_TOL) -> dict:
    """A's 90 % interval and whether its upper end is the prior's bound (A <= 1) rather than the data's."""
    s = post.summary()["A"]
    r0 = float(np.median(_draws(post, "R0")))
    at_bound = s["hi"] >= 1.0 - tol * (1.0 - r0)
    return {"lo": s["lo"], "hi": s["hi"], "bound": 1.0, "at_bound": bool(at_bound)}


def departure(curve, fit_mask, post, *, consecutive: int = 3, fall_z: float = 4.0, interval: float = 0.9) -> dict:
    """The first eval after the fit window at which the run left its fitted law, or None.

    Returns ``{"step", "compute", "reason", "outside"}`` (``outside``: the held-out evals outside the predictive
    band, of ``n_held``) or ``{"step": None, ...}`` when the run kept to its law (or has no later evals)."""
    fit_mask = np.asarray(fit_mask, bool)
    held = np.flatnonzero(~fit_mask)
    out = {"step": None, "compute": None, "reason": None, "outside": 0, "n_held": int(held.size)}
    if held.size == 0:
        return out
    has_counts = curve.val_n is not None and curve.val_k is not None
    nk = (curve.val_n * curve.val_k)[held] if has_counts else None
    if post.likelihood == "counts" and nk is None:
        return out  # the band needs the eval sizes the fit used
    lo, hi = predictive_band(post, curve.compute[held], nk=nk, interval=interval)
    r = curve.reward[held]
    side = np.where(r > hi, 1, np.where(r < lo, -1, 0))
    out["outside"] = int(np.count_nonzero(side))
    first = None
    run = 0
    for j, s in enumerate(side):
        run = run + 1 if s and j and side[j - 1] == s else int(s != 0)
        if run == consecutive:
            i = held[j - consecutive + 1]
            first = (i, f"{consecutive} evals in a row {'above' if s > 0 else 'below'} the fit's "
                        f"{100 * interval:.0f} % predictive band (from step {int(curve.step[i])} on)")
            break
    if has_counts:  # a fall from the best eval so far by more than two evals' noise allows
        n = curve.val_n.astype(float)
        for i in held:
            j = int(np.argmax(curve.reward[: i + 1]))  # the best eval so far
            pb, p = curve.reward[j], curve.reward[i]
            sd = np.sqrt(pb * (1 - pb) / n[j] + p * (1 - p) / n[i])
            if pb - p > fall_z * max(sd, 1.0 / n[i]):
                if first is None or i < first[0]:
                    first = (i, f"a fall from the best eval so far ({pb:.3f} at step {int(curve.step[j])}) to "
                                f"{p:.3f}: {(pb - p) / max(sd, 1.0 / n[i]):.1f} standard deviations of two evals' "
                                "noise")
                break
    if first is not None:
        i, why = first
        out.update(step=int(curve.step[i]), compute=float(curve.compute[i]), reason=why)
    return out


def seed_spread(halves, late: float = 0.5) -> float:
    """The sd by which two seeds' curves of one recipe differ, from their fit windows alone.

    ``halves``: [(RunCurve, fit_mask)] of two or more seeds. At each step that every seed evaluated inside its window
    (step > 0, the later ``late`` fraction of those steps: nearest the extrapolation), the seeds' rewards vary by
    the run-to-run variance tau^2 plus each eval's sampling noise, bounded by p (1 - p) / (val_n val_k) (the
    held-out prompts are the same for every seed, so the prompts' difficulty is not noise between seeds). tau^2 is
    the mean over those steps of (sample variance - mean noise variance), floored at 0; two seeds' curves differ by
    sqrt(2) tau, which is what is returned."""
    if len(halves) < 2:
        raise ValueError("seed_spread: needs the fit windows of two or more seeds")
    per_seed = []
    for curve, mask in halves:
        m = np.asarray(mask, bool) & (curve.step > 0)
        nk = (curve.val_n * curve.val_k)[m] if curve.val_n is not None else np.full(m.sum(), np.inf)
        per_seed.append({int(s): (float(r), float(n)) for s, r, n in zip(curve.step[m], curve.reward[m], nk)})
    steps = sorted(set.intersection(*(set(d) for d in per_seed)))
    if not steps:
        raise ValueError("seed_spread: the seeds share no eval step inside their fit windows")
    steps = steps[int(len(steps) * (1 - late)):] or steps[-1:]
    excess = []
    for s in steps:
        r = np.array([d[s][0] for d in per_seed])
        nk = np.array([d[s][1] for d in per_seed])
        excess.append(np.var(r, ddof=1) - np.mean(r * (1 - r) / nk))
    return float(np.sqrt(2.0 * max(float(np.mean(excess)), 0.0)))


def another_seed(curves: dict, posteriors: dict, masks: dict, interval: float = 0.9) -> dict:
    """Where another seed of one recipe would end, for two or more seeds of it.

    ``curves``, ``posteriors``, ``masks``: per run name, its RunCurve, the posterior fitted on its fit window and that
    window's mask. The run-to-run spread s comes from the fit windows alone (:func:`seed_spread`); each run's
    interval of one eval (:func:`predictive_band` with ``seed_sd=s``) is taken at every other seed's last compute
    and eval size and held against that seed's last eval. Returns ``{"spread": s, "runs": {name: {"others": [...],
    "bands": [[lo, hi], ...], "finals": [...], "inside": k, "width": mean band width}}}``. Raises ValueError where
    the spread cannot be estimated (:func:`seed_spread`: fewer than two seeds, or no shared eval step)."""
    names = [n for n in curves if n in posteriors and n in masks]
    spread = seed_spread([(curves[n], masks[n]) for n in names])
    runs = {}
    for n in names:
        others = [o for o in names if o != n]
        bands, finals = [], []
        for o in others:
            c = curves[o]
            nk = None if c.val_n is None else c.val_n[-1:] * c.val_k[-1:]
            lo, hi = predictive_band(posteriors[n], c.compute[-1:], nk=nk, interval=interval, seed_sd=spread)
            bands.append([float(lo[0]), float(hi[0])])
            finals.append(float(c.reward[-1]))
        runs[n] = {"others": others, "bands": bands, "finals": finals,
                   "inside": int(sum(lo <= f <= hi for (lo, hi), f in zip(bands, finals))),
                   "width": float(np.mean([hi - lo for lo, hi in bands]))}
    return {"spread": spread, "runs": runs}
