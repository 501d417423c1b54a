"""DAPO overlong reward shaping, the length-penalty alternative to interruptions (RECIPE.md section 4).

    R_len(y) = clip((L_max - |y|) / L_cache - 1, -1, 0)

0 up to ``L_max - L_cache`` tokens, then linear down to -1 at ``L_max`` and -1 beyond. It is added to correct
traces only (incorrect ones keep their reward). Defaults live in ``LengthConfig.penalty_max_len`` (14336) and
``LengthConfig.penalty_cache`` (2048).
"""

from __future__ import annotations

import numpy as np


def _xp(*arrays):
    """jax.numpy if any input is a jax array (keeps the function jittable), else numpy."""
    for a in arrays:
        if type(a).__module__.startswith(("jax", "jaxlib")):
            import jax.numpy as jnp

            return jnp
    return np


def length_penalty(rewards, lengths, correct, max_len: int, cache_len: int):
    """Rewards with the overlong penalty added to correct traces: ``r + correct * R_len(|y|)``.

    Args:
      rewards: [B] float rewards (numpy or jax).
      lengths: [B] completion lengths ``|y|`` in tokens.
      correct: [B] bool (or 0/1) correctness of each trace.
      max_len: ``L_max``; cache_len: ``L_cache`` (> 0).

    Returns:
      [B] float rewards of the same array kind as the inputs.
    """
    if cache_len <= 0:
        raise ValueError(f"cache_len must be > 0, got {cache_len}")
    xp = _xp(rewards, lengths, correct)
    r = xp.asarray(rewards, dtype=xp.float32 if xp is not np else np.float64)
    penalty = xp.clip((max_len - xp.asarray(lengths, dtype=r.dtype)) / cache_len - 1.0, -1.0, 0.0)
    return r + xp.where(xp.asarray(correct).astype(bool), penalty, 0.0)
