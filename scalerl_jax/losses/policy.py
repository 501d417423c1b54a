"""Policy-gradient losses: CISPO (ScaleRL default), GSPO, DAPO and GRPO, with three aggregations.

Shapes: B completions in the batch, T completion positions. Every completion belongs to a prompt group
(``group_ids_B``, ints in ``[0, B)``); groups are reduced with segment sums over ``B`` segments, so the loss
is jittable for any grouping.

Notation (RECIPE.md section 2). For a masked-in token t of completion i:

    r_{i,t}   = logp_{i,t} - gen_logp_{i,t}                 (log IS ratio)
    rho_{i,t} = exp(r_{i,t})                                (token IS ratio)

Per-token loss terms ``l_{i,t}`` (the loss is minimised, so each is minus the surrogate objective):

    cispo: l = -sg(min(rho, eps_max)) * A_i * logp_{i,t}          (eps_max an absolute cap, no lower clip)
    dapo:  l = -min(rho * A_i, clip(rho, 1 - eps_low, 1 + eps_high) * A_i)
    grpo:  same as dapo; the preset uses eps_low = eps_high (symmetric clip)
    gspo:  s_i = exp(sum_t r_{i,t} / |y_i|)                         (length-normalised sequence ratio)
           l = -min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i), the same value on every token of i

Aggregations (the loss is ``sum_{i,t} w_{i,t} * l_{i,t}`` with constant weights built from the mask only):

    prompt: w = 1 / (n_tok(g) * P)    n_tok(g) = masked tokens of prompt g, P = prompts with n_tok(g) > 0
    sample: w = 1 / (|y_i| * S)       S = completions with |y_i| > 0
    token:  w = 1 / N                 N = masked tokens in the batch

So the CISPO gradient per masked token is exactly ``-min(rho, eps_max) * A_i * w_{i,t}``, tokens above the cap
included. For the clipped kinds the gradient is ``-rho * A * w`` where the clip is inactive and 0 where it is
active for the sign of A (A > 0: rho > 1 + eps_high; A < 0: rho < 1 - eps_low). For GSPO each token of an
unclipped sequence gets ``-s_i * A_i * W_i / |y_i|`` with ``W_i = sum_t w_{i,t}``; with sample aggregation that
is GSPO's own ``1/G`` sequence average.

Rows with an all-zero mask (filtered zero-variance groups, padding rows) contribute nothing and are not
counted in P, S or N. Masked-out positions may hold any finite or infinite log-prob: they are replaced
before use, so they change neither the loss nor its gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.config import LossConfig

_KINDS = ("cispo", "gspo", "dapo", "grpo")
_AGGREGATIONS = ("prompt", "sample", "token")


def aggregation_weights(mask_BT: jax.Array, group_ids_B: jax.Array, aggregation: str) -> jax.Array:
    """Per-token weights ``w_BT`` of an aggregation (see the module docstring); zero off the mask.

    ``sum(w_BT) == 1`` whenever at least one token is masked in, else 0.
    """
    mask_BT = mask_BT.astype(jnp.float32)
    B = mask_BT.shape[0]
    len_B = mask_BT.sum(axis=1)
    if aggregation == "token":
        row_w_B = jnp.broadcast_to(1.0 / jnp.maximum(len_B.sum(), 1.0), (B,))
    elif aggregation == "sample":
        n_samples = (len_B > 0).sum().astype(jnp.float32)
        row_w_B = 1.0 / (jnp.maximum(len_B, 1.0) * jnp.maximum(n_samples, 1.0))
    elif aggregation == "prompt":
        tok_G = jax.ops.segment_sum(len_B, group_ids_B, num_segments=B)
        n_prompts = (tok_G > 0).sum().astype(jnp.float32)
        row_w_B = 1.0 / (jnp.maximum(tok_G[group_ids_B], 1.0) * jnp.maximum(n_prompts, 1.0))
    else:
        raise ValueError(f"aggregation must be one of {_AGGREGATIONS}, got {aggregation!r}")
    return mask_BT * row_w_B[:, None]


def _ppo_clip(ratio: jax.Array, adv: jax.Array, eps_low: float, eps_high: float) -> tuple[jax.Array, jax.Array]:
    """``min(ratio*A, clip(ratio, 1-eps_low, 1+eps_high)*A)`` written so the clipped branch has no gradient.

    Returns (surrogate, clipped) where ``clipped`` marks where the clip is active for the sign of A.
    """
    clipped = ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))
    bounded = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    surrogate = jnp.where(clipped, bounded * adv, ratio * adv)
    return surrogate, clipped


def policy_loss(
    logp: jax.Array,
    gen_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    group_ids: jax.Array,
    cfg: LossConfig,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Policy loss of ``cfg.kind`` aggregated by ``cfg.aggregation`` (formulas in the module docstring).

    Args:
      logp: [B, T] log-probs of the sampled tokens under the policy being trained (the gradient flows here).
      gen_logp: [B, T] log-probs under the generator policy that sampled them (treated as constants).
      advantages: [B] per-completion advantages.
      mask: [B, T] 1 on tokens the policy sampled, 0 on prompt, padding and injected tokens.
      group_ids: [B] int prompt-group index of each completion, in ``[0, B)``.
      cfg: ``LossConfig`` (kind, eps_max, eps_low, eps_high, aggregation).

    Returns:
      ``(loss, metrics)``; metrics are float32 scalars over masked-in tokens (0 when there are none):
      ``loss``; ``clip_frac`` (fraction of tokens where the clip / CISPO truncation is active; for GSPO the
      tokens of clipped sequences); ``is_ratio_mean``, ``is_ratio_max``, ``is_ratio_min`` (token ratio rho);
      ``is_ratio_above_cap_frac`` (rho > eps_max, for every kind); ``seq_ratio_mean`` (mean over completions of
      the length-normalised sequence ratio s_i); ``is_ratio_std`` (standard deviation of rho over the tokens) and
      ``logp_diff_abs_mean`` (mean of |logp - gen_logp|): generator / trainer mismatch, pure numerics on an
      on-policy batch (e.g. bfloat16 generators, ``RolloutConfig.generator_dtype``), plus policy lag on stale
      ones; ``n_tokens``, ``n_samples``, ``n_prompts``.
    """
    if cfg.kind not in _KINDS:
        raise ValueError(f"LossConfig.kind must be one of {_KINDS}, got {cfg.kind!r}")
    mask_BT = mask.astype(jnp.float32)
    on_BT = mask_BT > 0
    group_ids_B = group_ids.astype(jnp.int32)
    adv_B = jax.lax.stop_gradient(advantages.astype(jnp.float32))
    gen_logp_BT = jax.lax.stop_gradient(gen_logp.astype(jnp.float32))
    # Replace masked-out entries first: a -inf or huge pad log-prob must not turn into NaN via 0 * inf.
    logp_BT = jnp.where(on_BT, logp.astype(jnp.float32), 0.0)
    log_ratio_BT = jnp.where(on_BT, logp_BT - jnp.where(on_BT, gen_logp_BT, 0.0), 0.0)
    ratio_BT = jnp.exp(log_ratio_BT)
    len_B = mask_BT.sum(axis=1)
    seq_ratio_B = jnp.exp((log_ratio_BT * mask_BT).sum(axis=1) / jnp.maximum(len_B, 1.0))
    adv_BT = jnp.broadcast_to(adv_B[:, None], mask_BT.shape)

    if cfg.kind == "cispo":
        weight_BT = jax.lax.stop_gradient(jnp.minimum(ratio_BT, cfg.eps_max))
        term_BT = -weight_BT * adv_BT * logp_BT
        clipped_BT = ratio_BT > cfg.eps_max
    elif cfg.kind in ("dapo", "grpo"):
        surrogate_BT, clipped_BT = _ppo_clip(ratio_BT, adv_BT, cfg.eps_low, cfg.eps_high)
        term_BT = -surrogate_BT
    else:  # gspo
        surrogate_B, clipped_B = _ppo_clip(seq_ratio_B, adv_B, cfg.eps_low, cfg.eps_high)
        term_BT = jnp.broadcast_to(-surrogate_B[:, None], mask_BT.shape)
        clipped_BT = jnp.broadcast_to(clipped_B[:, None], mask_BT.shape)

    w_BT = aggregation_weights(mask_BT, group_ids_B, cfg.aggregation)
    loss = jnp.sum(jnp.where(on_BT, term_BT * w_BT, 0.0))

    n_tokens = mask_BT.sum()
    denom = jnp.maximum(n_tokens, 1.0)
    has_tok = n_tokens > 0
    tok_G = jax.ops.segment_sum(len_B, group_ids_B, num_segments=mask_BT.shape[0])
    n_samples = (len_B > 0).sum().astype(jnp.float32)
    sg_ratio_BT = jax.lax.stop_gradient(ratio_BT)
    metrics = {
        "loss": jax.lax.stop_gradient(loss),
        "clip_frac": (clipped_BT * mask_BT).sum() / denom,
        "is_ratio_mean": (sg_ratio_BT * mask_BT).sum() / denom,
        "is_ratio_max": jnp.where(has_tok, jnp.max(jnp.where(on_BT, sg_ratio_BT, -jnp.inf)), 0.0),
        "is_ratio_min": jnp.where(has_tok, jnp.min(jnp.where(on_BT, sg_ratio_BT, jnp.inf)), 0.0),
        "is_ratio_above_cap_frac": ((sg_ratio_BT > cfg.eps_max) * mask_BT).sum() / denom,
        "is_ratio_std": jnp.sqrt((jnp.square(sg_ratio_BT - (sg_ratio_BT * mask_BT).sum() / denom) * mask_BT).sum()
                                 / denom),
        "logp_diff_abs_mean": (jnp.abs(jax.lax.stop_gradient(log_ratio_BT)) * mask_BT).sum() / denom,
        "seq_ratio_mean": (jax.lax.stop_gradient(seq_ratio_B) * (len_B > 0)).sum() / jnp.maximum(n_samples, 1.0),
        "n_tokens": n_tokens,
        "n_samples": n_samples,
        "n_prompts": (tok_G > 0).sum().astype(jnp.float32),
    }
    return loss, metrics
