"""The paper's point fit: a grid over (A, C_mid), B fitted at every grid point, lowest SSE wins.

The paper loops over 71 x 100 grid points calling ``scipy.optimize.curve_fit`` for B at each.
Here the inner 1-D fit runs for all grid points at once in JAX: a log-spaced scan of B brackets the
minimum, then golden-section search narrows the bracket. ``fit_grid_scipy`` keeps the plain loop as
the reference the benchmark and tests compare against.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .checks import ScalingFitWarning, check_fit_data
from .law import sigmoid_reward

__all__ = ["PAPER_A_GRID", "PAPER_C_MID_GRID", "SigmoidFit", "fit_grid", "fit_grid_scipy", "grid_ranges"]

# RECIPE.md section 1: A in {0.450, 0.455, ..., 0.800}; C_mid in 100 linearly spaced values in [100, 40000].
PAPER_A_GRID = np.round(np.arange(0.450, 0.800 + 1e-9, 0.005), 3)
PAPER_C_MID_GRID = np.linspace(100.0, 40000.0, 100)
A_STEP = 0.005
B_MIN, B_MAX = 0.02, 20.0
_N_B_SCAN = 64
_N_GOLDEN = 40


@dataclasses.dataclass(frozen=True)
class SigmoidFit:
    """A point fit of the law. A, B, C_mid, R0: parameters; sse: sum of squared residuals on the fitted points.

    grid: "paper" or "data" (which A / C_mid grid was searched); n_points: points used; on_edge: names of
    grid parameters whose best value sits on the grid's edge (the true optimum may lie outside it).
    """

    A: float
    B: float
    C_mid: float
    R0: float
    sse: float
    n_points: int = 0
    grid: str = "data"
    on_edge: tuple = ()

    def predict(self, compute):
        """R(compute) under the fitted parameters."""
        return sigmoid_reward(np.asarray(compute, dtype=float), self.A, self.B, self.C_mid, self.R0)

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return dataclasses.asdict(self) | {"on_edge": list(self.on_edge)}


def grid_ranges(compute, reward, R0, grid: str = "auto"):
    """The (A grid, C_mid grid) that ``fit_grid`` searches, and which kind was chosen.

    "paper": the paper's fixed grids (GPU-hour scale, 0.45 <= A <= 0.80). "data": A from just above
    R0 to 1 in steps of 0.005, C_mid log-spaced over [c_min / 2, 20 c_max] (c_min the smallest positive
    compute): tiny runs measure compute in device-hours of 1e-3..1e-1 and may have A above 0.8.
    "auto": "paper" when the data look like the paper's (compute up to between 1,000 and 10^6, R0 below
    the grid's lower end, rewards well below its upper end), else "data".
    """
    c = np.asarray(compute, dtype=float)
    r = np.asarray(reward, dtype=float)
    if grid == "auto":
        paper_like = 1e3 <= c.max() <= 1e6 and R0 < PAPER_A_GRID[0] and r.max() < PAPER_A_GRID[-1] - 0.05
        grid = "paper" if paper_like else "data"
    if grid == "paper":
        return PAPER_A_GRID.copy(), PAPER_C_MID_GRID.copy(), "paper"
    if grid != "data":
        raise ValueError(f"grid must be 'auto', 'paper' or 'data', got {grid!r}")
    a_lo = np.ceil((R0 + 1e-9) / A_STEP) * A_STEP
    a_lo = a_lo + A_STEP if a_lo <= R0 else a_lo
    a_grid = np.round(np.arange(a_lo, 1.0 + 1e-9, A_STEP), 3)
    c_min = c[c > 0].min()
    c_grid = np.geomspace(c_min / 2.0, 20.0 * c.max(), 120)
    return a_grid, c_grid, "data"


@jax.jit
def _grid_search(logc_N, pos_N, r_N, R0, a_G, logcm_H):
    """SSE-minimising B and its SSE for every (A, C_mid) pair: two [G, H] arrays."""
    y_N = r_N - R0
    log_b_S = jnp.linspace(np.log(B_MIN), np.log(B_MAX), _N_B_SCAN)

    def sse(a, logcm, log_b):
        frac_N = jnp.where(pos_N, jax.nn.sigmoid(jnp.exp(log_b) * (logc_N - logcm)), 0.0)
        return jnp.sum((y_N - (a - R0) * frac_N) ** 2)

    def per_a(a):
        def per_c(logcm):
            scan_S = jax.vmap(lambda lb: sse(a, logcm, lb))(log_b_S)
            k = jnp.argmin(scan_S)
            lo = log_b_S[jnp.maximum(k - 1, 0)]
            hi = log_b_S[jnp.minimum(k + 1, _N_B_SCAN - 1)]
            inv_phi = (np.sqrt(5.0) - 1.0) / 2.0

            def golden(_, bracket):
                lo, hi = bracket
                x1 = hi - inv_phi * (hi - lo)
                x2 = lo + inv_phi * (hi - lo)
                left = sse(a, logcm, x1) < sse(a, logcm, x2)
                return jnp.where(left, lo, x1), jnp.where(left, x2, hi)

            lo, hi = jax.lax.fori_loop(0, _N_GOLDEN, golden, (lo, hi))
            lb = 0.5 * (lo + hi)
            s = sse(a, logcm, lb)
            # Keep the scan's best if the bracket refinement did not improve on it (flat SSE in B).
            better = s <= scan_S[k]
            return jnp.where(better, jnp.exp(lb), jnp.exp(log_b_S[k])), jnp.minimum(s, scan_S[k])

        return jax.vmap(per_c)(logcm_H)

    # lax.map over A keeps memory at one [H, B-scan, N] slab instead of the whole grid.
    return jax.lax.map(per_a, a_G)


def fit_grid(
    compute,
    reward,
    R0,
    *,
    exclude_below: float = 0.0,
    grid: str = "auto",
    A_grid=None,
    C_mid_grid=None,
) -> SigmoidFit:
    """The paper's fit (RECIPE.md section 1): grid over A and C_mid, B fitted per grid point, lowest SSE.

    Args:
        compute, reward: the curve (reward a pass rate in [0, 1]; compute strictly increasing).
        R0: the starting reward, fixed (the paper uses the reward before RL).
        exclude_below: drop points with compute below this (the paper drops the first ~1.5k GPU-h).
        grid: "auto", "paper" or "data" (see ``grid_ranges``); ``A_grid`` / ``C_mid_grid`` override it.

    B is searched in [0.02, 20] (log-spaced scan, then golden section; all grid points at once).
    Warns (ScalingFitWarning) when the best A or C_mid sits on the edge of its grid.
    """
    c, r, R0, _ = check_fit_data(compute, reward, R0, exclude_below=exclude_below, name="fit_grid")
    a_grid, c_grid, kind = grid_ranges(c, r, R0, grid)
    if A_grid is not None:
        a_grid, kind = np.atleast_1d(np.asarray(A_grid, dtype=float)), "custom"
    if C_mid_grid is not None:
        c_grid, kind = np.atleast_1d(np.asarray(C_mid_grid, dtype=float)), "custom"
    if a_grid.size == 0 or c_grid.size == 0 or np.any(c_grid <= 0):
        raise ValueError("fit_grid: A and C_mid grids must be non-empty and C_mid positive")
    pos = c > 0
    logc = np.log(np.where(pos, c, 1.0))
    b_GH, sse_GH = _grid_search(
        jnp.asarray(logc, jnp.float32), jnp.asarray(pos), jnp.asarray(r, jnp.float32), jnp.float32(R0),
        jnp.asarray(a_grid, jnp.float32), jnp.asarray(np.log(c_grid), jnp.float32),
    )
    sse_GH = np.asarray(sse_GH, dtype=float)
    i, j = np.unravel_index(np.nanargmin(sse_GH), sse_GH.shape)
    A, C_mid, B = float(a_grid[i]), float(c_grid[j]), float(np.asarray(b_GH)[i, j])
    # Recompute the SSE in float64 so that it is comparable with other fits of the same data.
    sse = float(np.sum((r - sigmoid_reward(c, A, B, C_mid, R0)) ** 2))
    edges = []
    if a_grid.size > 1 and i in (0, a_grid.size - 1):
        edges.append("A")
    if c_grid.size > 1 and j in (0, c_grid.size - 1):
        edges.append("C_mid")
    if B <= B_MIN * 1.01 or B >= B_MAX * 0.99:
        edges.append("B")
    if edges and kind != "custom":
        hint = ("A reached 1, so the window does not show the ceiling yet" if kind == "data" and A >= 1.0 - 1e-9
                else "the optimum may lie outside it; try grid='data' or wider A_grid / C_mid_grid")
        warnings.warn(
            f"fit_grid: best {', '.join(edges)} on the edge of the {kind} grid (A={A:.3f}, B={B:.3g}, "
            f"C_mid={C_mid:.4g}); {hint}",
            ScalingFitWarning,
            stacklevel=2,
        )
    return SigmoidFit(A=A, B=B, C_mid=C_mid, R0=R0, sse=sse, n_points=int(c.size), grid=kind, on_edge=tuple(edges))


def fit_grid_scipy(compute, reward, R0, *, exclude_below: float = 0.0, grid: str = "auto") -> SigmoidFit:
    """The paper's loop written plainly: one ``scipy.optimize.curve_fit`` for B per (A, C_mid) grid point.

    Kept as the reference that ``fit_grid`` is checked and timed against; slow (thousands of fits).
    """
    from scipy.optimize import curve_fit

    c, r, R0, _ = check_fit_data(compute, reward, R0, exclude_below=exclude_below, name="fit_grid_scipy")
    a_grid, c_grid, kind = grid_ranges(c, r, R0, grid)
    best = (np.inf, None)
    for A in a_grid:
        for C_mid in c_grid:
            def f(x, B, A=A, C_mid=C_mid):
                return sigmoid_reward(x, A, B, C_mid, R0)

            try:
                (B,), _ = curve_fit(f, c, r, p0=[1.0], bounds=(B_MIN, B_MAX))
            except (RuntimeError, ValueError):
                continue
            sse = float(np.sum((r - f(c, B)) ** 2))
            if sse < best[0]:
                best = (sse, (float(A), float(B), float(C_mid)))
    if best[1] is None:
        raise RuntimeError("fit_grid_scipy: curve_fit failed at every grid point")
    A, B, C_mid = best[1]
    return SigmoidFit(A=A, B=B, C_mid=C_mid, R0=R0, sse=best[0], n_points=int(c.size), grid=kind)
