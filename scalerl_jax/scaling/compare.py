"""Comparing runs from their posteriors: P(A_1 > A_2), P(B_1 > B_2), and the paper's rule.

The paper treats A values within 0.02 of each other as equal (seed-to-seed spread was +-0.015); then
the run that reaches the shared ceiling with less compute, the larger B at that shared A, is the better.
"""

from __future__ import annotations

import itertools

import numpy as np

from .bayes import SigmoidPosterior, fit_bayes_batch

__all__ = ["prob_greater", "compare_posteriors", "compare_at_shared_A", "pairwise_table", "A_MARGIN"]

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
