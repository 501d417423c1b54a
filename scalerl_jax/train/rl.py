"""The RL loss for the pure train step: model forward, FP32 chunked token log-probs, policy loss (plus, for an MoE
model with ``LossConfig.moe_aux_coef`` > 0, the router's load-balancing loss, logged as ``moe_aux_loss``).

A :class:`TrainBatch` row is one completion, prompt and completion tokens in one right-padded row:

    tokens      [B, T] int32    prompt + completion (+ padding)
    loss_mask   [B, T] float32  1 where token t was sampled by the policy (0 on prompt, padding and
                                injected interruption tokens, and on whole rows of filtered groups)
    gen_logp    [B, T] float32  generator log-prob of token t (meaningful where loss_mask = 1)
    staleness   [B, T] int32    trainer version - version of the policy that produced token t
    advantages  [B]    float32  (already normalised, 0 for filtered groups)
    rewards     [B]    float32
    group_ids   [B]    int32    prompt group of the row, in [0, B)
    truncated   [B]    float32  1 if the completion never produced an answer
    prompt_len  [B]    int32    the row's prompt tokens (0 on padding rows)

In the *split* layout (``build_train_batch(prompt_cols=P)``, the loss's ``shared_prefix=(P, n)``) a row's prompt
fills columns 0..prompt_len-1 and its completion starts at column P, whatever the prompt's length; the rows of
a group are n consecutive rows, so the loss computes each group's prompt once (:mod:`scalerl_jax.models.shared_prefix`).

The loss reports ``update_ok = False`` (the train step then leaves params and optimiser untouched) when
any log-prob, advantage or reward on a used row is NaN/inf, or when no token survives filtering.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import LossConfig, ModelConfig
from scalerl_jax.losses import policy_loss
from scalerl_jax.losses.logprobs import token_logprobs
from scalerl_jax.models.model import forward_hidden, head_weight
from scalerl_jax.models.moe import load_balancing_loss
from scalerl_jax.models.shared_prefix import forward_shared, predicting_states

BATCH_FIELDS = ("tokens", "loss_mask", "gen_logp", "staleness", "advantages", "rewards", "group_ids", "truncated",
                "prompt_len")


class TrainBatch(NamedTuple):
    tokens: np.ndarray
    loss_mask: np.ndarray
    gen_logp: np.ndarray
    staleness: np.ndarray
    advantages: np.ndarray
    rewards: np.ndarray
    group_ids: np.ndarray
    truncated: np.ndarray
    prompt_len: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        return self._asdict()


def abstract_batch(batch: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes/dtypes of a TrainBatch (AOT compilation)."""
    bt, b = (batch, seq_len), (batch,)
    f32, i32 = jnp.float32, jnp.int32
    spec = {"tokens": (bt, i32), "loss_mask": (bt, f32), "gen_logp": (bt, f32), "staleness": (bt, i32),
            "advantages": (b, f32), "rewards": (b, f32), "group_ids": (b, i32), "truncated": (b, f32),
            "prompt_len": (b, i32)}
    return {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in spec.items()}


def router_metrics(stats: dict, n_experts: int) -> dict[str, jax.Array]:
    """Train-row router statistics of an MoE forward: per-expert share of the token-expert assignments
    (averaged over MoE layers; 1/E each when balanced), the worst layer's max / min share relative to uniform,
    and the fraction of assignments dropped by a capacity limit."""
    load = jax.lax.stop_gradient(stats["load"])  # [Lm, E]
    out = {f"router_load_e{e}": load[:, e].mean() for e in range(n_experts)}
    out["router_load_max"] = load.max() * n_experts
    out["router_load_min"] = load.min() * n_experts
    out["router_dropped_frac"] = 1.0 - jax.lax.stop_gradient(stats["kept"]).mean()
    return out


def rl_loss(model_cfg: ModelConfig, loss_cfg: LossConfig, *, temperature: float = 1.0, logp_chunk: int = 512,
            shared_prefix: tuple[int, int] | None = None):
    """``loss_fn(params, batch) -> (loss, metrics)`` for :func:`scalerl_jax.train.make_train_step`.

    ``shared_prefix=(P, n)``: the batch is in the split layout (prompts in columns < P, completions from column P,
    groups of n consecutive rows) and each group's prompt is computed once; the loss and its gradient are the
    plain layout's up to the order of float summation."""
    head_kw = dict(chunk=logp_chunk, head_dtype=model_cfg.head_dtype, temperature=temperature,
                   head_matmul_impl=model_cfg.head_matmul_impl)

    def plain(params, batch):
        """(logp, entropy, router stats) of tokens 1..T-1 of every row, and the column the arrays start at."""
        tokens = batch["tokens"]
        # The forward runs over all T tokens (the last position's output is unused, causality keeps the
        # others exact) so the sequence stays a multiple of the attention / log-prob chunks: T - 1 would
        # force padding copies of every block input.
        h, router = forward_hidden(params, tokens, model_cfg, return_aux=True)
        targets = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
        logp, ent = token_logprobs(h, head_weight(params, model_cfg), targets, **head_kw)
        return logp[:, :-1], ent[:, :-1], router, 1

    def shared(params, batch):
        """(logp, entropy, None) of the completion tokens (columns P..T-1) and P."""
        P, n = shared_prefix
        tokens, plen = batch["tokens"], batch["prompt_len"][::n]
        h_p, h_c = forward_shared(params, tokens[::n, :P], plen, tokens[:, P:], model_cfg)
        logp, ent = token_logprobs(predicting_states(h_p, h_c, plen), head_weight(params, model_cfg),
                                   tokens[:, P:], **head_kw)
        return logp, ent, None, P

    def loss_fn(params, batch):
        logp, ent, router, first = (shared if shared_prefix else plain)(params, batch)
        mask = batch["loss_mask"][:, first:].astype(jnp.float32)
        gen = batch["gen_logp"][:, first:]
        used_row = mask.sum(-1) > 0
        finite = (
            jnp.all(jnp.isfinite(gen) | (mask == 0))
            & jnp.all(jnp.isfinite(batch["advantages"]) | ~used_row)
            & jnp.all(jnp.isfinite(batch["rewards"]) | ~used_row)
        )
        # sanitise so non-finite inputs cannot leak NaN into the graph; the step is skipped anyway
        gen = jnp.where(jnp.isfinite(gen) & (mask > 0), gen, 0.0)
        adv = jnp.where(jnp.isfinite(batch["advantages"]), batch["advantages"], 0.0)
        loss, m = policy_loss(logp, gen, adv, mask, batch["group_ids"], loss_cfg)
        n_tok = jnp.maximum(mask.sum(), 1.0)
        stale = batch["staleness"][:, first:].astype(jnp.float32)
        metrics = dict(m)
        metrics.update(
            entropy=jax.lax.stop_gradient((ent * mask).sum() / n_tok),
            staleness_mean=(stale * mask).sum() / n_tok,
            staleness_max=jnp.max(jnp.where(mask > 0, stale, 0.0)),
            truncation_rate=batch["truncated"].astype(jnp.float32).mean(),
            inputs_finite=finite.astype(jnp.float32),
            update_ok=finite,
        )
        if router is not None:
            metrics.update(router_metrics(router, model_cfg.n_experts))
            aux = load_balancing_loss(router["load"], router["prob"], model_cfg.top_k)
            metrics["moe_aux_loss"] = jax.lax.stop_gradient(aux)
            if loss_cfg.moe_aux_coef > 0:
                loss = loss + loss_cfg.moe_aux_coef * aux
                metrics["policy_loss"] = metrics["loss"]
                metrics["loss"] = jax.lax.stop_gradient(loss)
        return loss, metrics

    return loss_fn
