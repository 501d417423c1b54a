"""The ceiling-posterior figure: smooth densities that match the distribution they estimate, respect A <= 1, and
draw a unimodal posterior with one peak (a 60-bin histogram of the same samples has dozens of spurious ones)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from scipy.stats import norm

from scalerl_jax.scaling.plots import plot_A_posteriors, smooth_density


def _local_maxima(y: np.ndarray) -> int:
    return int(np.sum((y[1:-1] > y[:-2]) & (y[1:-1] >= y[2:])))


def test_density_matches_the_normal_it_was_drawn_from():
    a = np.random.default_rng(0).normal(0.6, 0.05, 4000)
    x, y = smooth_density(a)
    # a density: it integrates to 1 (the trapezoid rule on the plot's grid is off by far less than 1 %)
    assert abs(np.trapezoid(y, x) - 1.0) < 0.01
    # a kernel estimate from n = 4000 draws: its standard error at the mode is about sqrt(f / (2 sqrt(pi) n h))
    # ~ 3 % of the peak (Silverman's bandwidth h ~ 0.01 here) and its smoothing bias about h^2 / (2 sd^2) ~ 2 % of
    # it; 10 % of the peak is a few times both
    true = norm.pdf(x, 0.6, 0.05)
    assert np.max(np.abs(y - true)) < 0.1 * true.max()
    # the mode within 0.4 sd of the truth: the sample's own mean is within 3 sd / sqrt(n) ~ 0.0024 of it
    assert abs(x[np.argmax(y)] - 0.6) < 0.02


def test_density_reflected_at_the_ceiling_bound():
    # a posterior piled against A = 1 (half-normal below 1): the true density is largest at 1 and zero above it
    a = 1.0 - np.abs(np.random.default_rng(1).normal(0.0, 0.03, 4000))
    x, y = smooth_density(a)
    assert x.max() <= 1.0
    assert abs(np.trapezoid(y, x) - 1.0) < 0.01  # no mass leaks past the bound
    assert y[-1] > 0.85 * y.max()  # not halved at the edge, as an unreflected kernel estimate would be
    # at the bound the half-normal's density is twice a normal's peak; a reflected kernel estimate from 4000 draws
    # is within its standard error (~3 %) plus the smoothing's bias at a peak (~h^2 / (2 sd^2) ~ 5 % for
    # h ~ 0.01, sd 0.03) of it: 20 % is twice both
    assert abs(y[-1] - 2 * norm.pdf(0.0, 0.0, 0.03)) < 0.2 * y[-1]


def test_posterior_figure_draws_one_peak_per_unimodal_run_and_a_fixed_ceiling():
    rng = np.random.default_rng(2)
    posts = {"scalerl": SimpleNamespace(samples={"A": rng.normal(0.7, 0.04, 2000)}),
             "variant": SimpleNamespace(samples={"A": rng.normal(0.62, 0.06, 2000)}),
             "fixed": SimpleNamespace(samples={"A": np.full(100, 0.8)})}
    fig = plot_A_posteriors(posts)
    ax = fig.axes[0]
    curves = [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 2]
    assert len(curves) == 2
    for ln in curves:
        assert _local_maxima(np.asarray(ln.get_ydata())) == 1
    # teeth: the histogram the figure used to draw has many local maxima on the same samples
    dens, _ = np.histogram(posts["scalerl"].samples["A"], bins=60, density=True)
    assert _local_maxima(dens) > 3
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    a = posts["scalerl"].samples["A"]
    lo, hi = np.sort(a)[[int(0.05 * a.size), int(0.95 * a.size)]]
    assert "fixed: 0.800 (fixed)" in labels
    assert any(t.startswith(f"scalerl: {a.mean():.3f} [{lo:.2f}") for t in labels), labels
