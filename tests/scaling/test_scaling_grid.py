"""fit_grid against a plain SciPy loop over the paper's grid, and on bad input."""

import warnings

import numpy as np
import pytest
from scipy.optimize import curve_fit

from scalerl_jax.scaling import ScalingFitWarning, SigmoidFit, fit_grid
from scalerl_jax.scaling.grid import A_STEP, PAPER_A_GRID, PAPER_C_MID_GRID


def _law(c, A, B, C_mid, R0):
    # Written out independently of the package: R0 + (A - R0) / (1 + (C_mid / C)^B), C > 0.
    return R0 + (A - R0) / (1.0 + (C_mid / c) ** B)


def _noisy_curve(A=0.61, B=1.92, C_mid=2542.0, R0=0.3, n=75, seed=0):
    rng = np.random.default_rng(seed)
    c = np.linspace(5 * C_mid / n, 5 * C_mid, n)
    mu = _law(c, A, B, C_mid, R0)
    # Binomial noise of 1,000 prompts x 16 samples with prompt difficulty drawn from a Beta (over-dispersion).
    p = rng.beta(mu[:, None] * 2.0, (1 - mu[:, None]) * 2.0, size=(n, 1000))
    return c, rng.binomial(16, p).mean(axis=1) / 16


def _scipy_paper_loop(c, r, R0, a_grid, c_grid):
    best = (np.inf, None)
    for A in a_grid:
        for C_mid in c_grid:
            try:
                (B,), _ = curve_fit(lambda x, B: _law(x, A, B, C_mid, R0), c, r, p0=[1.0], bounds=(0.02, 20.0))
            except RuntimeError:
                continue
            sse = np.sum((r - _law(c, A, B, C_mid, R0)) ** 2)
            if sse < best[0]:
                best = (sse, (A, B, C_mid))
    return best


def test_fit_grid_matches_scipy_loop_on_paper_grid():
    c, r = _noisy_curve()
    half = c <= c.max() / 2
    # Subsample the paper's grid (every 2nd A, every 4th C_mid) to keep the SciPy loop to ~900 fits.
    a_grid, c_grid = PAPER_A_GRID[::2], PAPER_C_MID_GRID[::4]
    fit = fit_grid(c[half], r[half], 0.3, A_grid=a_grid, C_mid_grid=c_grid)
    sse, (A, B, C_mid) = _scipy_paper_loop(c[half], r[half], 0.3, a_grid, c_grid)
    assert isinstance(fit, SigmoidFit)
    assert abs(fit.A - A) <= 2 * A_STEP + 1e-9  # within one step of this grid (every 2nd A of the paper's)
    # B minimises the same SSE at the same (A, C_mid) in both: fit_grid's SSE is float32 over 38 residuals of ~0.02
    # from terms ~0.3 (cancellation x 15), so it is resolved to ~2 x 15 x 38 u ~ 7e-5 of itself, and a function known
    # to a relative epsilon pins its (quadratic) minimum to ~sqrt(epsilon) ~ 8e-3 of the minimiser's scale
    assert fit.B == pytest.approx(B, rel=0.01)
    # the SSE at two minimisers that close differs to second order (~epsilon), plus float32's own ~7e-5
    assert fit.sse == pytest.approx(sse, rel=1e-3)
    assert fit.C_mid == C_mid  # the same grid point, read from the same array


def test_fit_grid_auto_picks_paper_grid_and_recovers_noise_free_curve():
    c = np.linspace(100.0, 12710.0, 60)
    r = _law(c, 0.61, 1.92, 2542.0, 0.3)
    fit = fit_grid(c, r, 0.3)
    assert fit.grid == "paper"
    assert fit.A == pytest.approx(0.61, abs=A_STEP + 1e-9)  # within one step of the paper's grid
    # B is the sigmoid's slope in log C: with the centre off by up to half a C_mid step (202 of 2542: log 1.08 =
    # 0.077) over data spanning log(12710 / 100) = 4.8, the best slope tilts by about 0.077 / 4.8 ~ 2 %, and A's
    # half step (0.4 % of the gain) adds a little; 5 % is twice that
    assert fit.B == pytest.approx(1.92, rel=0.05)
    assert fit.C_mid == pytest.approx(2542.0, abs=404)  # paper's C_mid step is ~403 GPU-h


def test_fit_grid_data_grid_for_tiny_run_units():
    # Device-hours of a tiny run, a ceiling above the paper's 0.8 and R0 above its 0.45.
    c = np.linspace(0.0, 0.2, 20)
    r = _law(np.maximum(c, 1e-12), 0.85, 1.5, 0.04, 0.5)
    r[0] = 0.5
    fit = fit_grid(c, r, 0.5)
    assert fit.grid == "data"
    assert fit.A == pytest.approx(0.85, abs=A_STEP + 1e-9)  # within one step of the data grid
    # the data grid's C_mid is geometric, 120 points over [c_min / 2, 20 c_max]: steps of (40 x 19)^(1 / 119) - 1 =
    # 5.7 %, so the nearest point is within 2.9 % of 0.04; B tilts with that offset (log 1.029 = 0.028 over the
    # data's log(19) = 2.9: ~1 %) and with A's half step; 5 % bounds both
    assert fit.B == pytest.approx(1.5, rel=0.05)
    assert fit.C_mid == pytest.approx(0.04, rel=0.05)


def test_fit_grid_exclude_below_and_edge_warning():
    c, r = _noisy_curve()
    with pytest.raises(ValueError, match="exclude_below"):
        fit_grid(c, r, 0.3, exclude_below=c[-3])
    # A curve that climbs past 0.9: the paper's A grid tops out at 0.80, so the best A sits on its edge.
    r_high = _law(c, 0.95, 2.0, 1000.0, 0.3)
    with pytest.warns(ScalingFitWarning, match="edge"):
        fit = fit_grid(c, r_high, 0.3, grid="paper")
    # the grid's top, 0.800 rounded to 3 decimals: the float64 nearest 0.8
    assert "A" in fit.on_edge and fit.A == 0.8


def test_fit_grid_bad_input():
    c = np.linspace(0, 1, 10)
    r = np.linspace(0.3, 0.6, 10)
    with pytest.raises(ValueError, match="R0"):
        fit_grid(c, r, 1.5)
    with pytest.raises(ValueError, match="at least 5"):
        fit_grid(c[:3], r[:3], 0.3)
    with pytest.raises(ValueError, match="strictly increase"):
        fit_grid(c[::-1], r, 0.3)
    # Flat curve: a warning and a finite fit, never a crash.
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fit = fit_grid(c, np.full(10, 0.4), 0.4)
    assert any(issubclass(x.category, ScalingFitWarning) and "flat" in str(x.message) for x in w)
    assert np.isfinite([fit.A, fit.B, fit.C_mid, fit.sse]).all()
