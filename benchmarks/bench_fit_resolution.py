"""How much a run's first half can say about its ceiling: A's 90 % interval and the end prediction's error when
the sigmoid law is fitted on the first half of a simulated run, by eval schedule, eval size and curve shape.

    .venv/bin/python -m benchmarks.bench_fit_resolution [--seeds 3]
    .venv/bin/python -m benchmarks.bench_fit_resolution --measured A R0 B CMID_STEPS [--lengths 96 192 384]

Each case simulates a run of 144 steps whose true curve is the law with R0 0.30 and A 0.60 (C = step: FLOPs grow
linearly with steps), evaluated on n prompts x k samples (prompt pass rates ~ Beta with concentration 2 around the
curve, fresh prompts at every eval: a conservative noise model). It fits the evals up to step 72 with fit_bayes
(R0 fixed, the binomial-like likelihood, as experiments.loo does) and prints, over the noise seeds, the median
width of A's 90 % interval, the mean |error| of the prediction at step 144 against the true curve, and how often
the interval covered it, for evals every 2, 4 or 8 steps (train.eval_every). Nothing is timed: this is a design
table for testbeds (what experiments.presets.tiny_chain_plan's validation set and eval cadence follow).

Measured 2026-12-03 with ``--seeds 8`` (table: docs/results/fit_resolution.md): A's width falls with the eval draws
in the fit window (evals x n x k) and with the curve's sharpness. B = 3, midpoint at 5 % of the run: 0.013-0.057 at
400 x 4 every 2-8 steps, 0.022-0.30 at 100 x 4. B = 1.5, midpoint at 15 %: 0.11-0.31 at 400 x 4, 0.32-0.39 at 100 x
4. An earlier version of this script also tried evals spaced evenly in log(step) (20 points from step 2, 15 of them
in the first half): no narrower than every 4 steps (0.03-0.27 at 400 x 4), since they crowd the rise and leave few
points on the approach to the ceiling, which is what pins A; the schedule was not kept.
"""

from __future__ import annotations

import argparse
import itertools
import warnings

import numpy as np

from scalerl_jax.scaling import fit_bayes_batch, sigmoid_reward

STEPS, R0, A = 144, 0.30, 0.60
EVERY = (2, 4, 8)


def simulate(steps, a, r0, B, cmid, n, k, rng):
    mu = sigmoid_reward(steps, a, B, cmid, r0)
    p = rng.beta(mu[:, None] * 2.0, (1.0 - mu[:, None]) * 2.0, size=(len(steps), n))
    return rng.binomial(k, p).mean(axis=1) / k


def fit_cases(cases: list[tuple], seeds: int) -> dict[tuple, list]:
    """cases: (run steps, A, R0, B, C_mid in steps, n, k, eval every). Per case and noise seed: (A's 90 % width,
    |prediction at the last step - true curve|, whether the 90 % interval covered it), fitting steps <= half."""
    curves, keys = [], []
    for case, seed in itertools.product(cases, range(seeds)):
        total, a, r0, B, cmid, n, k, every = case
        steps = np.arange(every, total + 1, every, dtype=float)
        half = steps <= total / 2
        r = simulate(steps[half], a, r0, B, cmid, n, k, np.random.default_rng(seed))
        curves.append(dict(compute=steps[half], reward=r, R0=r0, n_prompts=n, k_samples=k))
        keys.append(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        posts = fit_bayes_batch(curves, num_samples=500, num_chains=2)
    rows: dict[tuple, list] = {}
    for case, post in zip(keys, posts):
        total, a, r0, B, cmid, *_ = case
        s = post.summary()["A"]
        end = np.array([float(total)])
        mean, lo, hi = (float(np.ravel(x)[0]) for x in post.predict(end))
        true = float(sigmoid_reward(end, a, B, cmid, r0)[0])
        rows.setdefault(case, []).append((s["hi"] - s["lo"], abs(mean - true), lo <= true <= hi))
    return rows


def _cells(vals) -> str:
    w, e, c = zip(*vals)
    return f"{np.median(w):.3f} | {np.mean(e):.3f} | {sum(c)}/{len(c)} |"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="noise seeds per case")
    ap.add_argument("--measured", type=float, nargs=4, metavar=("A", "R0", "B", "CMID_STEPS"),
                    help="instead of the design grid: one measured curve (e.g. a run's whole-run fit, C_mid in "
                         "steps), fitted on the first half of runs of --lengths steps")
    ap.add_argument("--lengths", type=int, nargs="+", default=[96, 192, 384, 768], help="run lengths (--measured)")
    ap.add_argument("--evals", type=int, nargs=3, default=[200, 4, 4], metavar=("N", "K", "EVERY"),
                    help="eval prompts, samples per prompt, steps between evals (--measured)")
    args = ap.parse_args(argv)
    head = "| A 90% width (median) | mean abs error at end | covered |"
    if args.measured:
        a, r0, B, cmid = args.measured
        n, k, every = args.evals
        rows = fit_cases([(t, a, r0, B, cmid, n, k, every) for t in args.lengths], args.seeds)
        print(f"true A {a}, R0 {r0}, B {B}, C_mid at step {cmid:g}; evals {n} x {k} every {every} steps; fit on the "
              f"first half; {args.seeds} noise seeds per row\n")
        print(f"| run steps | evals in fit {head}\n|---|---|---|---|---|")
        for case, vals in rows.items():
            print(f"| {case[0]} | {case[0] // 2 // every} | {_cells(vals)}")
        return
    grid = itertools.product((1.5, 3.0), (0.05, 0.15), ((100, 4), (400, 4)), EVERY)
    rows = fit_cases([(STEPS, A, R0, B, frac * STEPS, n, k, every) for B, frac, (n, k), every in grid], args.seeds)
    print(f"true A {A}, R0 {R0}, {STEPS} steps, fit on steps <= {STEPS // 2}; {args.seeds} noise seeds per row\n")
    print(f"| B | C_mid / run | evals n x k | eval every | evals in fit {head}")
    print("|---|---|---|---|---|---|---|---|")
    for (_, _, _, B, cmid, n, k, every), vals in rows.items():
        print(f"| {B} | {cmid / STEPS:g} | {n} x {k} | {every} | {STEPS // 2 // every} | {_cells(vals)}")


if __name__ == "__main__":
    main()
