"""The model API every caller uses, dispatching on ``ModelConfig.arch`` in this one place.

Each architecture module (:mod:`~scalerl_jax.models.llama`: dense, :mod:`~scalerl_jax.models.llama4`: MoE) provides
``param_specs(cfg)``, ``forward_hidden(params, tokens, cfg, positions=None, return_aux=False)`` and
``forward_cached(params, tokens, positions, cache, cfg)``; everything else here (shapes, axes, init, abstract
params, the LM head, the KV cache) is common. Dependencies run one way: model -> llama / llama4 -> moe -> layers /
params -> config / sharding.
"""

from __future__ import annotations

from types import ModuleType

import jax
import jax.numpy as jnp

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import layers as nn
from scalerl_jax.models import llama, llama4
from scalerl_jax.models import params as P
from scalerl_jax.models.head_matmul import head_matmul
from scalerl_jax.models.params import Params

KVCache = tuple[dict[str, jax.Array], ...]  # one {"k": [B, K, S, Dh], "v": [B, K, S, Dh]} per layer

#: the module that runs each ``ModelConfig.arch``: the dense decoder (Llama, Qwen2, Qwen3) or the MoE decoder
#: (Llama 4, Qwen3-MoE); what differs within a module is declared per arch (``ModelConfig`` properties)
ARCHS: dict[str, ModuleType] = {"llama": llama, "qwen2": llama, "qwen3": llama, "llama4": llama4,
                                "qwen3_moe": llama4}


def _arch(cfg: ModelConfig) -> ModuleType:
    if cfg.arch not in ARCHS:
        raise ValueError(f"ModelConfig.arch must be one of {tuple(ARCHS)}, got {cfg.arch!r}")
    return ARCHS[cfg.arch]


def param_specs(cfg: ModelConfig) -> Params:
    """Every weight of ``cfg``'s model, declared once (:class:`~scalerl_jax.models.params.Weight`)."""
    return _arch(cfg).param_specs(cfg)


def param_shapes(cfg: ModelConfig) -> Params:
    """Shape of every parameter (same tree structure as the params)."""
    return P.shapes(param_specs(cfg))


def param_axes(cfg: ModelConfig) -> Params:
    """Logical axis names for every parameter (same tree structure as the params)."""
    return P.axes(param_specs(cfg))


def abstract_params(cfg: ModelConfig) -> Params:
    """ShapeDtypeStructs of the params: AOT compilation without allocating weights."""
    return P.abstract(param_specs(cfg))


def init_params(cfg: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random init: N(0, std) matrices (projections into the residual stream scaled by 1/sqrt(2L)), unit norms."""
    return P.initialise(param_specs(cfg), key, std=std, n_layers=cfg.n_layers)


def forward_hidden(params: Params, tokens_BT: jax.Array, cfg: ModelConfig, positions_BT=None,
                   return_aux: bool = False):
    """Final-norm hidden states [B, T, D] (compute dtype) of a causal pass without a cache. With ``return_aux``:
    (hidden, aux) where aux is the MoE router statistics (``{"load": [Lm, E], "prob": [Lm, E], "kept": [Lm]}``) or
    None. ``positions_BT`` other than 0..T-1 needs ``attention_impl="reference"`` (the library kernels mask by row
    index)."""
    if positions_BT is not None and cfg.attention_impl != "reference":
        raise ValueError(f"forward_hidden: explicit positions_BT need ModelConfig.attention_impl='reference'; the "
                         f"{cfg.attention_impl!r} kernels assume positions 0..T-1")
    return _arch(cfg).forward_hidden(params, tokens_BT, cfg, positions_BT, return_aux=return_aux)


def head_weight(params: Params, cfg: ModelConfig) -> jax.Array:
    """The LM head as [D, V] (the transposed embedding when tied)."""
    return params["embed"].T if cfg.tie_embeddings else params["lm_head"]


def lm_logits(params: Params, hidden: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Logits from final hidden states, always returned as float32.

    ``head_dtype == "float32"``: inputs and weights are cast to float32 before the matmul (the ScaleRL
    fix), for training and generation alike. ``"bfloat16"``: the matmul runs in bfloat16 (the ablation), then the
    result is cast up.
    """
    hdt = nn.dtype(cfg.head_dtype)
    w = head_weight(params, cfg).astype(hdt)
    with jax.named_scope("lm_head"):
        if hdt == jnp.float32:  # at the precision of cfg.head_matmul_impl (scalerl_jax/models/head_matmul.py)
            return head_matmul(hidden, w, cfg.head_matmul_impl)
        logits = nn.proj(hidden.astype(hdt), w, preferred_element_type=hdt)
    return logits.astype(jnp.float32)


def forward(params: Params, tokens_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Float32 logits [B, T, V] of a causal pass over ``tokens_BT``."""
    return lm_logits(params, forward_hidden(params, tokens_BT, cfg), cfg)


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
    """A zeroed KV cache of ``max_len`` slots per sequence: a tuple of ``cfg.n_layers`` layers' ``{"k", "v"}:
    [B, K, S, Dh]`` (separate buffers, so a layer reads and writes its own in place)."""
    shape = (batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    dt = nn.dtype(dtype or cfg.dtype)
    return tuple({"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)} for _ in range(cfg.n_layers))


def forward_cached(params: Params, tokens_BT: jax.Array, positions_BT: jax.Array, cache: KVCache,
                   cfg: ModelConfig) -> tuple[jax.Array, KVCache]:
    """Run ``tokens_BT`` at absolute ``positions_BT`` (per row), writing their keys/values into cache
    slot = position and attending to every slot <= the query position.

    Prefill is a call with positions 0..T-1 (right padding is harmless: a pad's slot is overwritten by
    the real token decoded at that position before any query can see it); decode is a call with T = 1.
    Rows advance independently, so a batch may mix sequences of different lengths. Returns final-norm
    hidden states [B, T, D] (feed the positions you need to :func:`lm_logits`) and the updated cache.
    """
    return _arch(cfg).forward_cached(params, tokens_BT, positions_BT, cache, cfg)
