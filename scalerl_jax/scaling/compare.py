"""Comparing runs from their posteriors: P(A_1 > A_2), P(B_1 > B_2), and the paper's rule.

The paper treats A values within 0.02 of each other as equal (seed-to-seed spread was +-0.015); then
the run that reaches the shared ceiling with less compute, the larger B at that shared A, is the better.
"""

from __future__ import annotations

import itertools

import numpy as np

from .bayes import SigmoidPosterior, fit_bayes_batch

__all__ = ["prob_greater", "compare_posteriors", "compare_at_shared_A", "pairwise_table", "over_seeds", "A_MARGIN"]

A_MARGIN = 0.02


def prob_greater(x, y) -> float:
    """P(X > Y) for independent X ~ samples ``x`` and Y ~ samples ``y``, over all pairs (ties count half)."""
    x = np.asarray(x, dtype=float).ravel()
    ys = np.sort(np.asarray(y, dtype=float).ravel())
    below = np.searchsorted(ys, x, side="left")
    at_or_below = np.searchsorted(ys, x, side="right")
    return float(np.mean(below + 0.5 * (at_or_below - below)) / ys.size)


def compare_posteriors(p1: SigmoidPosterior, p2: SigmoidPosterior, *, a_margin: float = A_MARGIN) -> dict:
    """P(A_1 > A_2), P(B_1 > B_2), the difference in posterior mean A, and whether the paper's margin applies."""
    dA = float(np.mean(p1.samples["A"]) - np.mean(p2.samples["A"]))
    return {
        "P_A1_gt_A2": prob_greater(p1.samples["A"], p2.samples["A"]),
        "P_B1_gt_B2": prob_greater(p1.samples["B"], p2.samples["B"]),
        "dA_mean": dA,
        "A_within_margin": abs(dA) <= a_margin,
    }


def compare_at_shared_A(
    p1: SigmoidPosterior,
    p2: SigmoidPosterior,
    *,
    a_margin: float = A_MARGIN,
    seed: int = 0,
    num_samples: int = 1000,
    num_chains: int = 4,
) -> dict:
    """The paper's rule: if the posterior mean A's differ by more than ``a_margin``, the higher A wins;
    otherwise refit both with A fixed at the mean of the two and compare B (larger B: the shared ceiling is
    approached with less compute).

    Returns the ``compare_posteriors`` fields plus "rule" ("A" or "B at shared A"), "better" (1 or 2), and
    for the B rule "A_shared" and "P_B1_gt_B2_at_shared_A".
    """
    out = compare_posteriors(p1, p2, a_margin=a_margin)
    if not out["A_within_margin"]:
        out["rule"] = "A"
        out["better"] = 1 if out["dA_mean"] > 0 else 2
        return out
    a_shared = float(0.5 * (np.mean(p1.samples["A"]) + np.mean(p2.samples["A"])))
    curves = []
    for p in (p1, p2):
        d = {"compute": p.compute, "reward": p.reward, "A": a_shared}
        d.update({k: v for k, v in p.inputs.items() if v is not None})
        curves.append(d)
    if (curves[0].keys() != curves[1].keys()):
        # Different likelihood variants cannot share one batched sampler; fit them one by one.
        q1 = fit_bayes_batch([curves[0]], seed=seed, num_samples=num_samples, num_chains=num_chains)[0]
        q2 = fit_bayes_batch([curves[1]], seed=seed + 1, num_samples=num_samples, num_chains=num_chains)[0]
    else:
        q1, q2 = fit_bayes_batch(curves, seed=seed, num_samples=num_samples, num_chains=num_chains)
    p_b = prob_greater(q1.samples["B"], q2.samples["B"])
    out.update(
        rule="B at shared A",
        A_shared=a_shared,
        B1_at_shared_A=float(np.mean(q1.samples["B"])),
        B2_at_shared_A=float(np.mean(q2.samples["B"])),
        P_B1_gt_B2_at_shared_A=p_b,
        better=1 if p_b > 0.5 else 2,
    )
    return out


def pairwise_table(posteriors: dict) -> list[dict]:
    """``compare_posteriors`` for every ordered pair of named posteriors (name -> SigmoidPosterior)."""
    rows = []
    for (n1, p1), (n2, p2) in itertools.permutations(posteriors.items(), 2):
        rows.append({"run_1": n1, "run_2": n2} | compare_posteriors(p1, p2))
    return rows


def _interval(x: np.ndarray, interval: float = 0.9) -> dict:
    q = (1.0 - interval) / 2.0
    return {"mean": float(np.mean(x)), "lo": float(np.quantile(x, q)), "hi": float(np.quantile(x, 1.0 - q))}


def over_seeds(samples: dict, reference: str, params: tuple[str, ...] = ("A", "B"), rng_seed: int = 0) -> dict:
    """A recipe's parameters averaged over its seeds, and the comparison of those averages with the reference's.

    ``samples``: recipe -> {seed: {param: posterior samples}} (each seed's run fitted on its own). The seed average
    of a parameter, e.g. A_bar = (A_s0 + A_s1 + A_s2) / 3, has as samples the averages of one draw from each seed's
    posterior (the fits are independent, so draw i of every seed, after shuffling each seed's draws, is a draw from
    their product). Each recipe is averaged over the seeds it shares with the reference, so every difference is
    paired by seed (same warm start, same validation set). Returns recipe -> {"seeds", param: {"mean", "lo", "hi"}
    (90 % interval of the seed average), "P_<param>_ref_gt": P(ref's average > this recipe's), "seeds_<param>_ref_gt":
    seeds whose own P(ref > recipe) exceeds 0.5, "draws": {param: the seed average's samples}}. The reference's own
    row has no P entries."""
    if reference not in samples:
        raise ValueError(f"over_seeds: no runs of the reference recipe {reference!r} (have {sorted(samples)})")
    rng = np.random.default_rng(rng_seed)
    cache: dict[tuple, dict] = {}

    def seed_mean(who: str, seeds: tuple) -> dict:
        if (who, seeds) not in cache:
            n = min(np.asarray(samples[who][s][params[0]]).size for s in seeds)
            cache[who, seeds] = {k: np.mean([rng.permutation(np.asarray(samples[who][s][k], dtype=float).ravel())[:n]
                                             for s in seeds], axis=0) for k in params}
        return cache[who, seeds]

    out = {}
    ref_seeds = set(samples[reference])
    for recipe, by_seed in samples.items():
        seeds = tuple(sorted(set(by_seed) & ref_seeds))
        if not seeds:
            continue
        row = {"seeds": [str(s) for s in seeds]}
        means = {who: seed_mean(who, seeds) for who in (recipe, reference)}
        for k in params:
            row[k] = _interval(means[recipe][k])
            if recipe != reference:
                row[f"P_{k}_ref_gt"] = prob_greater(means[reference][k], means[recipe][k])
                row[f"seeds_{k}_ref_gt"] = sum(prob_greater(samples[reference][s][k], by_seed[s][k]) > 0.5
                                               for s in seeds)
        out[recipe] = row | {"draws": means[recipe]}
    return out
