"""How much a run's first half can say about its ceiling: A's 90 % interval and the end prediction's error when
the sigmoid law is fitted on the first half of a simulated run, by eval schedule, eval size and curve shape.

    .venv/bin/python -m benchmarks.bench_fit_resolution [--seeds 3]

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


def simulate(steps, B, cmid, n, k, rng):
    mu = sigmoid_reward(steps, A, B, cmid, R0)
    p = rng.beta(mu[:, None] * 2.0, (1.0 - mu[:, None]) * 2.0, size=(len(steps), n))
    return rng.binomial(k, p).mean(axis=1) / k


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="noise seeds per case")
    args = ap.parse_args(argv)
    cases = list(itertools.product((1.5, 3.0), (0.05, 0.15), ((100, 4), (400, 4)), EVERY))
    curves, keys = [], []
    for (B, frac, (n, k), every), seed in itertools.product(cases, range(args.seeds)):
        rng = np.random.default_rng(seed)
        steps = np.arange(every, STEPS + 1, every, dtype=float)
        half = steps <= STEPS / 2
        r = simulate(steps[half], B, frac * STEPS, n, k, rng)
        curves.append(dict(compute=steps[half], reward=r, R0=R0, n_prompts=n, k_samples=k))
        keys.append((B, frac, n, k, every))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        posts = fit_bayes_batch(curves, num_samples=500, num_chains=2)
    rows: dict[tuple, list] = {}
    for key, (B, frac, *_), post in zip(keys, keys, posts):
        a = post.summary()["A"]
        mean, lo, hi = (float(np.ravel(x)[0]) for x in post.predict(np.array([float(STEPS)])))
        true = float(sigmoid_reward(np.array([float(STEPS)]), A, B, frac * STEPS, R0)[0])
        rows.setdefault(key, []).append((a["hi"] - a["lo"], abs(mean - true), lo <= true <= hi))
    print(f"true A {A}, R0 {R0}, {STEPS} steps, fit on steps <= {STEPS // 2}; {args.seeds} noise seeds per row\n")
    print("| B | C_mid / run | evals n x k | eval every | evals in fit | A 90% width (median) | mean abs error at "
          "end | covered |")
    print("|---|---|---|---|---|---|---|---|")
    for (B, frac, n, k, every), vals in rows.items():
        w, e, c = zip(*vals)
        print(f"| {B} | {frac} | {n} x {k} | {every} | {STEPS // 2 // every} | {np.median(w):.3f} | {np.mean(e):.3f} | "
              f"{sum(c)}/{len(c)} |")


if __name__ == "__main__":
    main()
