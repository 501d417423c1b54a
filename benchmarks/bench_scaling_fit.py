"""Scaling-fit benchmarks: grid fit vs the SciPy loop, fit_bayes wall time, and prediction error per Table 1 row.

    .venv/bin/python -m benchmarks.bench_scaling_fit [--quick]

Prints three tables. Times are wall-clock on this machine, with ratios against the reference measured in the
same run; "cold" includes JAX compilation, "warm" is a second call with the same shapes.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from scalerl_jax.scaling import ScalingFitWarning, fit_bayes, fit_bayes_batch, fit_grid, fit_grid_scipy, sigmoid_reward
from scalerl_jax.scaling.paper import TABLE1
from scalerl_jax.scaling.powerlaw import fit_power_law

R0 = 0.30


def simulate(A, B, C_mid, seed, n=75, span=5.0):
    """n evals from 0 to span x C_mid; 1,000 prompts x 16 samples, prompt pass rates ~ Beta(concentration 2)."""
    rng = np.random.default_rng(seed)
    c = np.linspace(0.0, span * C_mid, n)
    mu = sigmoid_reward(c, A, B, C_mid, R0)
    p = rng.beta(mu[:, None] * 2.0, (1.0 - mu[:, None]) * 2.0, size=(n, 1000))
    return c, rng.binomial(16, p).mean(axis=1) / 16


def timed(fn, *a, **k):
    t = time.perf_counter()
    out = fn(*a, **k)
    return out, time.perf_counter() - t


def bench_grid():
    c, r = simulate(0.61, 1.92, 2542.0, seed=0)
    half = c <= c.max() / 2
    _, cold = timed(fit_grid, c[half], r[half], R0, grid="paper")
    fit, warm = timed(fit_grid, c[half], r[half], R0, grid="paper")
    ref, t_ref = timed(fit_grid_scipy, c[half], r[half], R0, grid="paper")
    print("\n## fit_grid vs SciPy loop (paper grid: 71 A x 100 C_mid, %d points)" % half.sum())
    print("| impl | time (s) | ratio vs SciPy loop | A | B | C_mid |")
    print("|---|---|---|---|---|---|")
    print(f"| SciPy loop (7,100 curve_fit) | {t_ref:.2f} | 1.0 | {ref.A:.3f} | {ref.B:.4f} | {ref.C_mid:.0f} |")
    print(f"| fit_grid JAX, cold | {cold:.2f} | {t_ref / cold:.0f}x faster | | | |")
    print(f"| fit_grid JAX, warm | {warm:.3f} | {t_ref / warm:.0f}x faster | {fit.A:.3f} | {fit.B:.4f} | "
          f"{fit.C_mid:.0f} |")


def bench_bayes(num_samples, num_chains):
    print(f"\n## fit_bayes wall time ({num_chains} chains x {num_samples} draws, vectorised, counts likelihood)")
    print("| points | cold (s, incl. compile) | warm (s) | min ESS | max r_hat |")
    print("|---|---|---|---|---|")
    for n in (75, 300):
        c, r = simulate(0.61, 1.92, 2542.0, seed=1, n=n)
        kw = dict(n_prompts=1000, k_samples=16, num_samples=num_samples, num_chains=num_chains)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScalingFitWarning)
            _, cold = timed(fit_bayes, c, r, None, seed=0, **kw)
            post, warm = timed(fit_bayes, c, r, None, seed=1, **kw)
        print(f"| {n} | {cold:.1f} | {warm:.1f} | {min(post.ess.values()):.0f} | {max(post.r_hat.values()):.3f} |")


def bench_prediction(num_samples, num_chains, seeds):
    print(f"\n## |predicted R - true R| at 2x the fit compute (fit on C <= 2.5 C_mid, predict 5 C_mid), "
          f"mean over {seeds} data sets per row")
    print("| run | true R(5 C_mid) | Bayes (posterior mean) | Bayes 90% covers | grid fit | power law | power-law A |")
    print("|---|---|---|---|---|---|---|")
    curves, meta = [], []
    for i, (name, C_mid, B, A) in enumerate(TABLE1):
        for s in range(seeds):
            c, r = simulate(A, B, C_mid, seed=500 + 1000 * i + s)
            half = c <= c.max() / 2
            curves.append(dict(compute=c[half], reward=r[half], n_prompts=1000, k_samples=16))
            meta.append((name, A, B, C_mid, c, r, half))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingFitWarning)
        posts = fit_bayes_batch(curves, seed=0, num_samples=num_samples, num_chains=num_chains)
        rows = {}
        for post, (name, A, B, C_mid, c, r, half) in zip(posts, meta):
            target = 5.0 * C_mid
            truth = float(sigmoid_reward(target, A, B, C_mid, R0))
            m, lo, hi = (float(v[0]) for v in post.predict([target]))
            g = fit_grid(c[half], r[half], float(r[0]))
            keep = half & (c > 0)
            pl = fit_power_law(c[keep], r[keep])
            rows.setdefault(name, []).append(
                (truth, abs(m - truth), lo <= truth <= hi, abs(float(g.predict(target)) - truth),
                 abs(float(pl.predict(target)) - truth), pl.A))
    tot = []
    for name, vals in rows.items():
        v = np.array(vals, dtype=float)
        tot.append(v)
        print(f"| {name} | {v[0, 0]:.3f} | {v[:, 1].mean():.4f} | {v[:, 2].mean():.0%} | {v[:, 3].mean():.4f} | "
              f"{v[:, 4].mean():.4f} | {v[:, 5].mean():.3f} |")
    v = np.concatenate(tot)
    print(f"| **all** | | {v[:, 1].mean():.4f} | {v[:, 2].mean():.0%} | {v[:, 3].mean():.4f} | "
          f"{v[:, 4].mean():.4f} | |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer draws and data sets (a smoke run)")
    args = ap.parse_args()
    bench_grid()
    if args.quick:
        bench_bayes(200, 2)
        bench_prediction(200, 2, 1)
    else:
        bench_bayes(1000, 4)
        bench_prediction(1000, 4, 3)


if __name__ == "__main__":
    main()
