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
- **Another seed.** Where another seed of the same recipe would end: :func:`another_seed` fits the seeds' windows
  together (scaling/seeds.py: each seed's law drawn around the recipe's) and holds each seed's last eval against
  the band the *other* seeds' pooled fit gives for a new seed (the comparison report's table and the calibration
  study use it).
"""

from __future__ import annotations

import numpy as np

__all__ = ["a_bound", "another_seed", "departure", "predictive_band"]

#: A's interval counts as ending at the prior's bound when its upper end lies within this fraction of the prior's
#: range (1 - R0) of 1
BOUND_TOL = 0.02


def _draws(post, name: str) -> np.ndarray:
    return np.asarray(post._param(name), dtype=float)


def predictive_band(post, compute, nk=None, interval: float = 0.9, seed: int = 0, max_samples: int = 4000):
    """(lo, hi) of the posterior predictive of an eval at each ``compute``: the mean curve's draws plus one eval's
    noise from the fit's likelihood (``nk``: the eval's ``val_n x val_k``, needed by the counts likelihood). Where
    another seed of the recipe would lie instead: :func:`another_seed`."""
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


def _seed_data(curve, mask) -> dict:
    m = np.asarray(mask, bool)
    d = {"compute": curve.compute[m], "reward": curve.reward[m]}
    if curve.val_n is not None and curve.val_k is not None:
        d.update(n_prompts=curve.val_n[m], k_samples=curve.val_k[m])
    return d


def another_seed(curves: dict, masks: dict, interval: float = 0.9, *, seed: int = 0, num_samples: int = 500,
                 num_chains: int = 4) -> dict:
    """Where another seed of one recipe would end, from two or more seeds' fit windows (scaling/seeds.py).

    ``curves``, ``masks``: per run name, its RunCurve and its fit window's mask. The pooled fit over every seed's
    window gives the band of a new seed's eval at the seeds' last compute (``"pooled"``); each seed is then held
    out in turn: the pooled fit over the *other* seeds' windows gives the band at the held-out seed's last compute
    and eval size, held against its last eval (``"runs"``), so the check uses nothing of the seed it checks. Returns
    ``{"pooled": {"seeds", "compute", "band", "sd_A"}, "runs": {name: {"compute", "band", "final", "inside",
    "width"}}}``; ``sd_A``: the posterior median of the seeds' spread in logit((A - R0) / (1 - R0)). Raises
    ValueError for fewer than two seeds, or seeds that disagree on having eval sizes (val_n, val_k)."""
    from .seeds import fit_seeds_batch

    names = [n for n in curves if n in masks]
    if len(names) < 2:
        raise ValueError("another_seed: needs the fit windows of two or more seeds")
    data = {n: _seed_data(curves[n], masks[n]) for n in names}
    if len({"n_prompts" in d for d in data.values()}) > 1:
        raise ValueError("another_seed: some seeds have eval sizes (val_n, val_k) and some do not")

    def nk_last(n):
        c = curves[n]
        return None if c.val_n is None or c.val_k is None else float(c.val_n[-1] * c.val_k[-1])

    kw = dict(seed=seed, num_samples=num_samples, num_chains=num_chains)
    (pooled,) = fit_seeds_batch([[data[n] for n in names]], **kw)
    end = max(names, key=lambda n: curves[n].compute[-1])
    lo, hi = pooled.new_seed_band(curves[end].compute[-1:], nk=nk_last(end), interval=interval)
    out = {"pooled": {"seeds": names, "compute": float(curves[end].compute[-1]), "band": [float(lo[0]), float(hi[0])],
                      "sd_A": float(np.median(pooled.samples["sd_A"]))}, "runs": {}}
    held = fit_seeds_batch([[data[o] for o in names if o != n] for n in names], **kw)
    for n, post in zip(names, held):
        c = curves[n]
        lo, hi = post.new_seed_band(c.compute[-1:], nk=nk_last(n), interval=interval)
        final = float(c.reward[-1])
        out["runs"][n] = {"compute": float(c.compute[-1]), "band": [float(lo[0]), float(hi[0])], "final": final,
                          "inside": bool(lo[0] <= final <= hi[0]), "width": float(hi[0] - lo[0])}
    return out
