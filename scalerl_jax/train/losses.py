"""Loss functions for the train step that are not policy losses: next-token cross-entropy (warm start)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.model import forward_hidden, lm_logits


def cross_entropy_loss(cfg: ModelConfig):
    """``loss_fn(params, batch)`` for supervised next-token training.

    batch: ``tokens`` [B, T] int32 and ``loss_mask`` [B, T] float32, where ``loss_mask[b, t]`` = 1 means
    token t is a target (predicted from tokens < t). Loss = masked mean of -log p.
    """

    def loss_fn(params, batch):
        tokens, mask = batch["tokens"], batch["loss_mask"][:, 1:].astype(jnp.float32)
        h = forward_hidden(params, tokens[:, :-1], cfg)
        logits = lm_logits(params, h, cfg)
        logp = jax.nn.log_softmax(logits, axis=-1)
        tok_logp = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        n = jnp.maximum(mask.sum(), 1.0)
        loss = -(tok_logp * mask).sum() / n
        return loss, {"n_tokens": mask.sum()}

    return loss_fn
