"""The compute -> reward law of ScaleRL and the quantities derived from it.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

The fraction of the gain reached at compute C is written as a logistic function of log C,
``sigmoid(B * (log C - log C_mid))``, which is the same number but stays finite (and has finite
gradients) at C = 0 and for large B, where ``(C_mid / C) ** B`` overflows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["sigmoid_reward", "gain_fraction", "power_law_reward", "efficiency_F", "power_law_D"]


def _is_jax(*xs) -> bool:
    return any(isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) for x in xs)


def gain_fraction(compute, B, C_mid):
    """Fraction of the gain ``A - R0`` reached at ``compute``: ``1 / (1 + (C_mid / C) ** B)``; 0 at C = 0.

    Works on NumPy and JAX inputs (returns the same kind) and broadcasts its arguments.
    """
    xp = jnp if _is_jax(compute, B, C_mid) else np
    compute = xp.asarray(compute, dtype=xp.result_type(float))
    positive = compute > 0
    # A dummy 1.0 where C <= 0 keeps log() and its gradient finite; the where() then masks it out.
    log_c = xp.log(xp.where(positive, compute, 1.0))
    z = B * (log_c - xp.log(C_mid))
    if xp is jnp:
        frac = jax.nn.sigmoid(z)
    else:
        with np.errstate(over="ignore"):
            frac = 1.0 / (1.0 + np.exp(-z))
    return xp.where(positive, frac, 0.0)


def sigmoid_reward(compute, A, B, C_mid, R0):
    """ScaleRL's law ``R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)`` (RECIPE.md section 1).

    Args:
        compute: training compute C (any unit, e.g. device-hours); C = 0 gives R0.
        A: asymptotic reward (the ceiling). B: scaling exponent (> 0). C_mid: compute at half
            of the gain, same unit as ``compute``. R0: reward at zero compute.
    Returns the expected reward, NumPy for NumPy/float inputs and JAX for JAX inputs; all
    arguments broadcast, so a column of parameter samples against a row of computes gives a
    [samples, computes] array.
    """
    return R0 + (A - R0) * gain_fraction(compute, B, C_mid)


def power_law_D(A, B, C_mid, R0):
    """The coefficient D of the large-compute limit ``A - D / C**B`` of the sigmoid: ``(A - R0) * C_mid**B``."""
    return (A - R0) * C_mid**B


def power_law_reward(compute, A, D, B):
    """The plain power law ``R(C) = A - D / C**B`` (the paper's comparison model; -inf at C = 0)."""
    xp = jnp if _is_jax(compute, A, D, B) else np
    compute = xp.asarray(compute, dtype=xp.result_type(float))
    with np.errstate(divide="ignore"):
        return A - D / compute**B


def efficiency_F(reward, A, B, C_mid, R0):
    """The paper's efficiency transform ``F(R) = C_mid**B / ((A - R0) / (R - R0) - 1)``.

    On the law, ``F(R(C)) = C**B``, so ``log F`` against ``log C`` is a line of slope B. Returns NaN
    where R is not strictly between R0 and A (F is undefined there).
    """
    reward = np.asarray(reward, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (A - R0) / (reward - R0) - 1.0
        F = C_mid**B / ratio
    inside = (reward > min(R0, A)) & (reward < max(R0, A))
    return np.where(inside & (F > 0), F, np.nan)
