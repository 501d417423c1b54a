"""The optimiser: AdamW with linear warm-up, then constant (ScaleRL) or cosine (the warm start)."""

from __future__ import annotations

import jax
import optax

from scalerl_jax.config import TrainConfig


def lr_schedule(cfg: TrainConfig) -> optax.Schedule:
    """Linear warm-up over ``cfg.warmup_steps`` to ``cfg.lr``, then constant or cosine to 0 at ``cfg.steps``."""
    warm = max(cfg.warmup_steps, 0)
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, max(warm, 1), max(cfg.steps, warm + 1), 0.0)
    if warm == 0:
        return optax.constant_schedule(cfg.lr)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, cfg.lr, warm), optax.constant_schedule(cfg.lr)], [warm]
    )


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW; weight decay only on matrices (not on norm gains)."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    tx = optax.adamw(
        lr_schedule(cfg), b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps, weight_decay=cfg.weight_decay,
        mask=decay_mask,
    )
    if cfg.grad_clip and cfg.grad_clip > 0:
        tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), tx)
    return tx
