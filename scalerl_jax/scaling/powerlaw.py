"""The plain power law ``R(C) = A - D / C**B``: the comparison model the paper argues against.

It is the sigmoid's large-compute limit, so fitted on a window that has not yet bent it tends to put
the ceiling too high (the paper: A = 1.0 against the sigmoid's 0.645 on its 100k GPU-h run).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from scipy.optimize import curve_fit

from .checks import ScalingFitWarning, check_curve
from .law import power_law_reward

__all__ = ["PowerLawFit", "fit_power_law"]


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
    """Least-squares power law: ceiling A (bounded to [0, 1]), coefficient D, exponent B; sse on the fitted points."""

    A: float
    D: float
    B: float
    sse: float
    n_points: int

    def predict(self, compute):
        """R(compute); -inf at zero compute, where the power law has no value."""
        return power_law_reward(np.asarray(compute, dtype=float), self.A, self.D, self.B)

    def to_dict(self) -> dict:
        """JSON-ready fields."""
        return dataclasses.asdict(self)


def fit_power_law(compute, reward, *, exclude_below: float = 0.0) -> PowerLawFit:
    """Least-squares fit of ``A - D / C**B`` to the points with positive compute (>= ``exclude_below``).

    A is bounded to [0, 1] (a pass rate), B to [1e-3, 20]; D is fitted in log space. Several starting
    exponents are tried and the lowest SSE kept, because the surface is flat along A - D trade-offs.
    Warns when A ends on its bound 1 (the power law has not found a ceiling in the data).
    """
    c, r = check_curve(compute, reward, name="fit_power_law")
    keep = (c > 0) & (c >= exclude_below)
    c, r = c[keep], r[keep]
    if c.size < 4:
        raise ValueError(f"fit_power_law: {c.size} points with positive compute; need at least 4")
    # Work in compute relative to its maximum so that log D stays O(1) whatever the unit.
    scale = c.max()
    x = c / scale

    def f(x, A, log_d, B):
        return A - np.exp(log_d) / x**B

    best = None
    for b0 in (0.3, 1.0, 2.0):
        p0 = [min(r.max() + 0.05, 1.0), np.log(max(min(r.max() + 0.05, 1.0) - r[-1], 1e-3)), b0]
        try:
            p, _ = curve_fit(f, x, r, p0=p0, bounds=([0.0, -30.0, 1e-3], [1.0, 30.0, 20.0]), maxfev=20000)
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((r - f(x, *p)) ** 2))
        if best is None or sse < best[0]:
            best = (sse, p)
    if best is None:
        raise RuntimeError("fit_power_law: no start converged")
    sse, (A, log_d, B) = best
    D = float(np.exp(log_d) * scale**B)
    if A > 0.999:
        warnings.warn("fit_power_law: A ended on its bound 1; the power law sees no ceiling in this window",
                      ScalingFitWarning, stacklevel=2)
    return PowerLawFit(A=float(A), D=D, B=float(B), sse=sse, n_points=int(c.size))
