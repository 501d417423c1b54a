"""Group-relative advantages with batch-, prompt- or no std normalisation, and zero-variance filtering.

For completion i of prompt group g(i) with reward r_i (RECIPE.md section 2):

    Ahat_i = r_i - mean_{j in g(i)} r_j                                  (group mean-centring)
    batch:  A_i = Ahat_i / (std_{j kept} Ahat_j + EPS)                   (default; std over kept groups only)
    prompt: A_i = Ahat_i / (std_{j in g(i)} r_j + EPS)                   (GRPO)
    none:   A_i = Ahat_i                                                 (Dr. GRPO)

``keep_i`` is False when every reward of g(i) is equal (zero variance, including groups of one); such
completions get ``A_i = 0`` and are meant to be dropped from the loss (never resampled). Standard deviations
are population ones (divide by the count, ddof = 0), computed exactly per group whatever the group sizes.
``EPS = 1e-6`` keeps the divisions finite; with +-1 rewards every kept std is >= 0.25 (G <= 16) so its effect
is below 4e-6 relative.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

EPS = 1e-6
_NORMALIZATIONS = ("batch", "prompt", "none")


def compute_advantages(
    rewards: jax.Array, group_ids: jax.Array, normalization: str = "batch"
) -> tuple[jax.Array, jax.Array]:
    """Advantages ``A_B`` and the zero-variance ``keep_B`` mask (formulas in the module docstring).

    Args:
      rewards: [B] float rewards.
      group_ids: [B] int prompt-group index of each completion, in ``[0, B)``; groups may differ in size.
      normalization: "batch" | "prompt" | "none" (static under jit).

    Returns:
      ``(advantages_B float32, keep_B bool)``; ``advantages_B`` is 0 wherever ``keep_B`` is False.
    """
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {_NORMALIZATIONS}, got {normalization!r}")
    r_B = jnp.asarray(rewards, jnp.float32)
    gid_B = jnp.asarray(group_ids, jnp.int32)
    B = r_B.shape[0]
    count_G = jax.ops.segment_sum(jnp.ones_like(r_B), gid_B, num_segments=B)
    mean_G = jax.ops.segment_sum(r_B, gid_B, num_segments=B) / jnp.maximum(count_G, 1.0)
    centred_B = r_B - mean_G[gid_B]
    # Exact equality test of the group's rewards (not a variance threshold).
    max_G = jax.ops.segment_max(r_B, gid_B, num_segments=B)
    min_G = jax.ops.segment_min(r_B, gid_B, num_segments=B)
    keep_B = max_G[gid_B] > min_G[gid_B]
    keepf_B = keep_B.astype(jnp.float32)

    if normalization == "none":
        adv_B = centred_B
    elif normalization == "prompt":
        var_G = jax.ops.segment_sum(centred_B**2, gid_B, num_segments=B) / jnp.maximum(count_G, 1.0)
        adv_B = centred_B / (jnp.sqrt(var_G)[gid_B] + EPS)
    else:
        n_kept = jnp.maximum(keepf_B.sum(), 1.0)
        mu = (centred_B * keepf_B).sum() / n_kept  # 0 up to rounding; subtracted for an exact std
        std = jnp.sqrt((((centred_B - mu) ** 2) * keepf_B).sum() / n_kept)
        adv_B = centred_B / (std + EPS)
    return jnp.where(keep_B, adv_B, 0.0), keep_B
