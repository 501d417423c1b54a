"""Input checks shared by the fits: clear errors for data no fit can use, warnings for data a fit can use badly."""

from __future__ import annotations

import warnings

import numpy as np

MIN_POINTS = 5
# Below this spread the curve carries no information about A, B or C_mid (about one binomial
# standard deviation of a 1,000 x 16 evaluation at a pass rate of 0.5).
FLAT_SPREAD = 0.005


class ScalingFitWarning(UserWarning):
    """A fit ran but its result should not be trusted as is (flat curve, grid edge, poor mixing)."""


def check_curve(compute, reward, *, name: str = "curve", min_points: int = MIN_POINTS, stacklevel: int = 3):
    """Validate one reward-vs-compute curve and return it as two float64 arrays.

    Raises ValueError, naming the problem, for: mismatched or non 1-D shapes, fewer than
    ``min_points`` points, NaN or infinite values, negative compute, compute that does not strictly
    increase, and rewards outside [0, 1] (val_reward is a pass rate; training rewards are +-1).
    Warns (ScalingFitWarning) when the curve is flat, because then the ceiling and the exponent
    are not identifiable and any fit only restates the prior or the grid's edge. ``stacklevel`` is the
    warning's, counted from here (the default names the caller's caller: the fit that checked its data).
    """
    c = np.asarray(compute, dtype=float)
    r = np.asarray(reward, dtype=float)
    if c.ndim != 1 or r.ndim != 1:
        raise ValueError(f"{name}: compute and reward must be 1-D, got shapes {c.shape} and {r.shape}")
    if c.shape != r.shape:
        raise ValueError(f"{name}: compute has {c.size} points but reward has {r.size}")
    if c.size < min_points:
        raise ValueError(f"{name}: {c.size} points; the sigmoid has 3-4 parameters, need at least {min_points}")
    for label, x in (("compute", c), ("reward", r)):
        bad = np.flatnonzero(~np.isfinite(x))
        if bad.size:
            raise ValueError(f"{name}: {label} has non-finite values (NaN or inf) at positions {bad[:10].tolist()}")
    if np.any(c < 0):
        raise ValueError(f"{name}: compute is negative at positions {np.flatnonzero(c < 0)[:10].tolist()}")
    steps = np.diff(c)
    if np.any(steps <= 0):
        i = int(np.flatnonzero(steps <= 0)[0])
        raise ValueError(
            f"{name}: compute must strictly increase, but point {i + 1} ({c[i + 1]:g}) follows {c[i]:g}; "
            "sort the rows or drop duplicated evaluations"
        )
    out = np.flatnonzero((r < 0) | (r > 1))
    if out.size:
        raise ValueError(
            f"{name}: reward outside [0, 1] at positions {out[:10].tolist()} (e.g. {r[out[0]]:g}); the law is "
            "fitted to a pass rate (val_reward), not to +-1 training rewards"
        )
    if np.ptp(r) < FLAT_SPREAD:
        warnings.warn(
            f"{name}: reward is flat (spread {np.ptp(r):.4f} over {r.size} points); A, B and C_mid are not "
            "identifiable from it and the fit mostly reflects the grid or the prior",
            ScalingFitWarning,
            stacklevel=stacklevel,
        )
    return c, r


def check_R0(R0, name: str = "R0") -> float:
    """Validate a fixed starting reward: a finite number in [0, 1)."""
    try:
        value = float(R0)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {R0!r}") from None
    if not np.isfinite(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be finite and in [0, 1), got {value}")
    return value


def check_fit_data(compute, reward, R0, *, exclude_below: float = 0.0, name: str, allow_fitted_R0: bool = False,
                   stacklevel: int = 3):
    """The checks every sigmoid fit (grid and posterior) runs on its inputs, in one place.

    ``check_curve`` on the whole curve, then ``check_R0`` on R0 (None passes through when
    ``allow_fitted_R0``: the fit samples R0 then), then the points at compute >= ``exclude_below``:
    at least MIN_POINTS of them, and at least one with positive compute (the law is a sigmoid in log
    compute, so only positive compute carries information about B and C_mid).

    Returns (compute, reward, R0, keep): the kept points as float64 arrays, R0 as a float (or None), and
    ``keep``, the mask of kept points over the whole curve (for per-point inputs given for every row).
    ``stacklevel`` goes to ``check_curve``; the default 3 points the flat-curve warning at this one's caller.
    """
    c, r = check_curve(compute, reward, name=name, stacklevel=stacklevel)
    R0 = None if R0 is None and allow_fitted_R0 else check_R0(R0)
    keep = c >= exclude_below
    if keep.sum() < MIN_POINTS:
        raise ValueError(
            f"{name}: only {int(keep.sum())} points at compute >= exclude_below={exclude_below:g}; need {MIN_POINTS}"
        )
    c, r = c[keep], r[keep]
    if not np.any(c > 0):
        raise ValueError(f"{name}: no point has positive compute")
    return c, r, R0, keep
