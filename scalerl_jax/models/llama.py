"""Dense Llama-family decoder as pure functions over a weight pytree: HF ``LlamaForCausalLM`` (``arch="llama"``),
``Qwen2ForCausalLM`` (``"qwen2"``: the same layers with q/k/v biases) and ``Qwen3ForCausalLM`` (``"qwen3"``: a
weighted RMSNorm over each head of q and k before RoPE, and ``head_dim`` set apart from ``d_model / n_heads``).
What differs is declared in :func:`scalerl_jax.models.params.attention_specs` and applied in
:func:`scalerl_jax.models.layers.attention_block`; this module is the same for all three.

Dimension legend: see :mod:`scalerl_jax.models.layers`.

Parameters (declared once in :func:`param_specs`; layers stacked on a leading L axis so the depth is a
``lax.scan``): embed [V, D]; layers: attn_norm [L, D], wq [L, D, H, Dh], wk [L, D, K, Dh], wv [L, D, K, Dh],
wo [L, H, Dh, D], mlp_norm [L, D], w_gate [L, D, F], w_up [L, D, F], w_down [L, F, D]; final_norm [D];
lm_head [D, V] (absent when embeddings are tied); Qwen2 adds bq [L, H, Dh], bk / bv [L, K, Dh], Qwen3 q_norm / k_norm
[L, Dh].

Callers go through :mod:`scalerl_jax.models.model`, which dispatches on ``ModelConfig.arch``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import layers as nn
from scalerl_jax.models.params import Params, attention_specs, embedding_specs, swiglu_specs


def param_specs(cfg: ModelConfig) -> Params:
    """Every weight of the dense model, declared once (:class:`scalerl_jax.models.params.Weight`)."""
    specs = embedding_specs(cfg)
    specs["layers"] = {**attention_specs(cfg, cfg.n_layers), **swiglu_specs(cfg, cfg.n_layers, cfg.ffn_dim)}
    return specs


def _layer(x_BTD, lp, pos_BT, cfg: ModelConfig, cache=None):
    # The RoPE tables depend on the positions only: XLA hoists them out of the layer loop.
    rope = nn.rope_tables(pos_BT, nn.rope_inv_freq(cfg))

    def position(q, k):
        return nn.apply_rope(q, *rope), nn.apply_rope(k, *rope)

    with jax.named_scope("layer"):
        x_BTD, cache = nn.attention_block(x_BTD, lp, pos_BT, position, cfg, cache)
        return nn.ffn_block(x_BTD, lp["mlp_norm"], lp, cfg), cache


def forward_hidden(params: Params, tokens_BT: jax.Array, cfg: ModelConfig, positions_BT=None, return_aux=False):
    """Final-norm hidden states [B, T, D] (compute dtype) of a causal pass without a cache (with ``return_aux``:
    (hidden, None); the dense model has no router statistics)."""
    B, T = tokens_BT.shape
    pos = jnp.broadcast_to(jnp.arange(T), (B, T)) if positions_BT is None else positions_BT

    def layer(x, lp, pos):
        return _layer(x, lp, pos, cfg)[0]

    if cfg.remat:
        layer = nn.remat_layer(layer, nn.dtype(cfg.dtype))

    def body(x, lp):
        return layer(x, lp, pos), None

    # Without remat, a rolled scan stacks every layer's residuals into [L, ...] buffers (zero-filled, written
    # with dynamic-update-slice, read back with dynamic-slice): on CPU that traffic cost ~1/4 of the backward
    # pass. Unrolled, each layer's residuals are plain buffers. With remat only the [L, B, T, D] layer inputs
    # are stacked, and a rolled loop keeps compile time flat in depth (the 8B preset).
    x, _ = jax.lax.scan(body, nn.embed(params["embed"], tokens_BT, cfg), params["layers"], unroll=not cfg.remat)
    h = nn.rms_norm(x, params["final_norm"], cfg.rms_eps)
    return (h, None) if return_aux else h


def forward_cached(params: Params, tokens_BT: jax.Array, positions_BT: jax.Array, cache, cfg: ModelConfig):
    """KV-cached pass (contract: :func:`scalerl_jax.models.model.forward_cached`). The layers run unrolled, each
    on its own cache buffers (written in place): a rolled scan would carry one stacked [L, ...] cache and copy
    each layer's slice out of it at every step."""
    x = nn.embed(params["embed"], tokens_BT, cfg)
    out = []
    for i in range(cfg.n_layers):
        x, c = _layer(x, jax.tree.map(lambda a, i=i: a[i], params["layers"]), positions_BT, cfg, cache[i])
        out.append(c)
    return nn.rms_norm(x, params["final_norm"], cfg.rms_eps), tuple(out)
