"""Per-row temperature / top-p sampling helpers for the generation engine (pure, jit-friendly).

Recorded log-prob convention (what the trainer recomputes with ``token_logprobs(..., temperature=T)``):

    logp(y) = log_softmax(logits / T)[y]        for T > 0, *before* top-p truncation
    logp(y) = log_softmax(logits)[y]            for T == 0 (greedy; the token is argmax(logits))

Top-p only restricts which tokens may be drawn; it does not renormalise the recorded log-prob. Logits are
the float32 output of the FP32 LM head (:func:`scalerl_jax.models.lm_logits`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def top_p_mask(scaled_BV: jax.Array, top_p_B: jax.Array) -> jax.Array:
    """Boolean [B, V] mask of the smallest set of most-probable tokens whose mass reaches ``top_p``.

    A token is kept when the probability mass of the strictly more probable tokens is below ``top_p``;
    the most probable token is always kept, ties at the threshold are all kept. ``top_p == 1`` keeps all.
    """
    probs_BV = jax.nn.softmax(scaled_BV, axis=-1)
    sorted_BV = -jnp.sort(-probs_BV, axis=-1)  # descending
    mass_before_BV = jnp.cumsum(sorted_BV, axis=-1) - sorted_BV
    keep_sorted_BV = mass_before_BV < top_p_B[:, None]
    n_keep_B = jnp.maximum(jnp.sum(keep_sorted_BV, axis=-1), 1)
    thresh_B = jnp.take_along_axis(sorted_BV, (n_keep_B - 1)[:, None], axis=-1)[:, 0]
    return (probs_BV >= thresh_B[:, None]) | (top_p_B[:, None] >= 1.0)


def sample_tokens(
    logits_BV: jax.Array, temperature_B: jax.Array, top_p_B: jax.Array, key: jax.Array, *, use_top_p: bool
) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row; returns ``(tokens_B int32, logp_B float32)`` (see the module docstring).

    Rows with ``temperature == 0`` are greedy. Sampling is Gumbel-max over the (top-p masked) tempered logits.
    ``use_top_p`` is static: when False the sort needed by top-p is skipped entirely. ``key`` is one PRNG key
    for the whole batch, or one key per row (raw ``uint32[B, 2]`` or typed ``[B]``): then a row's noise depends
    only on its own key, not on its position in the batch or on the other rows.
    """
    logits_BV = logits_BV.astype(jnp.float32)
    greedy_B = temperature_B <= 0.0
    temp_B = jnp.where(greedy_B, 1.0, temperature_B).astype(jnp.float32)
    scaled_BV = logits_BV / temp_B[:, None]
    logp_all_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if key.ndim == (1 if typed else 2):
        V = scaled_BV.shape[1]
        gumbel_BV = jax.vmap(lambda k: jax.random.gumbel(k, (V,), jnp.float32))(key)
    else:
        gumbel_BV = jax.random.gumbel(key, scaled_BV.shape, jnp.float32)
    pert_BV = scaled_BV + gumbel_BV
    if use_top_p:
        pert_BV = jnp.where(top_p_mask(scaled_BV, top_p_B), pert_BV, -jnp.inf)
    sampled_B = jnp.argmax(pert_BV, axis=-1)
    greedy_tok_B = jnp.argmax(logits_BV, axis=-1)
    tok_B = jnp.where(greedy_B, greedy_tok_B, sampled_B).astype(jnp.int32)
    logp_B = jnp.take_along_axis(logp_all_BV, tok_B[:, None], axis=-1)[:, 0]
    return tok_B, logp_B
