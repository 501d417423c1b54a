"""One declaration per weight: shape, dtype, logical axes and initialiser together (:class:`Weight`).

A model declares its parameters once, as a pytree of :class:`Weight` (``param_specs(cfg)`` in each model module);
the shapes, the logical axes (hence the shardings), the random init and the abstract state for AOT compilation
are all read off that one tree, so they cannot drift apart. The building blocks below declare the pieces the
models share (embedding and head, attention with Qwen2's q/k/v biases and Qwen3's q/k norms, dense SwiGLU).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import jax
import jax.numpy as jnp

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.layers import dtype as to_dtype

Params = dict[str, Any]
Init = Literal["normal", "out_proj", "ones", "zeros"]


@dataclasses.dataclass(frozen=True)
class Weight:
    """One parameter: its shape, logical axis names (one per dimension, see :mod:`scalerl_jax.sharding`), storage
    dtype name and initialiser: ``normal`` N(0, std), ``out_proj`` N(0, std / sqrt(2 L)) (projections back into
    the residual stream), ``ones`` (norm gains), ``zeros`` (biases)."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    dtype: str = "float32"
    init: Init = "normal"

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.axes):
            raise ValueError(f"Weight: shape {self.shape} and axes {self.axes} differ in rank")


def _is_weight(x: Any) -> bool:
    return isinstance(x, Weight)


def shapes(specs: Params) -> Params:
    """The shape tuple of every weight (same tree structure as the params)."""
    return jax.tree.map(lambda w: w.shape, specs, is_leaf=_is_weight)


def axes(specs: Params) -> Params:
    """The logical axis names of every weight (same tree structure as the params)."""
    return jax.tree.map(lambda w: w.axes, specs, is_leaf=_is_weight)


def abstract(specs: Params) -> Params:
    """``ShapeDtypeStruct`` of every weight: AOT compilation without allocating anything."""
    return jax.tree.map(lambda w: jax.ShapeDtypeStruct(w.shape, to_dtype(w.dtype)), specs, is_leaf=_is_weight)


def initialise(specs: Params, key: jax.Array, *, std: float, n_layers: int) -> Params:
    """Random weights: one key per weight, split in the tree's flattening order."""
    flat, treedef = jax.tree_util.tree_flatten(specs, is_leaf=_is_weight)
    keys = jax.random.split(key, len(flat))
    out = []
    for w, k in zip(flat, keys):
        dt = to_dtype(w.dtype)
        if w.init in ("ones", "zeros"):
            out.append((jnp.ones if w.init == "ones" else jnp.zeros)(w.shape, dt))
        else:
            scale = std / math.sqrt(2 * n_layers) if w.init == "out_proj" else std
            out.append((scale * jax.random.normal(k, w.shape, jnp.float32)).astype(dt))
    return jax.tree_util.tree_unflatten(treedef, out)


# ---- declarations shared by the models ---------------------------------------------------------------


def embedding_specs(cfg: ModelConfig) -> Params:
    """``embed`` [V, D], ``final_norm`` [D] and, unless tied to the embedding, ``lm_head`` [D, V]."""
    D, V, dt = cfg.d_model, cfg.vocab_size, cfg.param_dtype
    specs: Params = {"embed": Weight((V, D), ("vocab", "embed"), dt), "final_norm": Weight((D,), ("norm",), dt, "ones")}
    if not cfg.tie_embeddings:
        specs["lm_head"] = Weight((D, V), ("embed", "vocab"), dt)
    return specs


def attention_specs(cfg: ModelConfig, n: int) -> Params:
    """The attention half of ``n`` stacked layers (and the FFN's pre-norm): norms, q / k / v / o projections; with
    ``cfg.qkv_bias`` the biases ``bq`` / ``bk`` / ``bv``, with ``cfg.head_qk_norm`` the per-head norm gains
    ``q_norm`` / ``k_norm`` [n, Dh]."""
    D, H, K, Dh, dt = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.param_dtype
    extra: Params = {}
    if cfg.qkv_bias:
        extra["bq"] = Weight((n, H, Dh), ("layers", "q_heads", "head_dim"), dt, "zeros")
        extra["bk"] = Weight((n, K, Dh), ("layers", "kv_heads", "head_dim"), dt, "zeros")
        extra["bv"] = Weight((n, K, Dh), ("layers", "kv_heads", "head_dim"), dt, "zeros")
    if cfg.head_qk_norm:
        extra["q_norm"] = Weight((n, Dh), ("layers", "norm"), dt, "ones")
        extra["k_norm"] = Weight((n, Dh), ("layers", "norm"), dt, "ones")
    return extra | {
        "attn_norm": Weight((n, D), ("layers", "norm"), dt, "ones"),
        "wq": Weight((n, D, H, Dh), ("layers", "embed", "q_heads", "head_dim"), dt),
        "wk": Weight((n, D, K, Dh), ("layers", "embed", "kv_heads", "head_dim"), dt),
        "wv": Weight((n, D, K, Dh), ("layers", "embed", "kv_heads", "head_dim"), dt),
        "wo": Weight((n, H, Dh, D), ("layers", "q_heads", "head_dim", "embed"), dt, "out_proj"),
        "mlp_norm": Weight((n, D), ("layers", "norm"), dt, "ones"),
    }


def swiglu_specs(cfg: ModelConfig, n: int, width: int, prefix: str = "w_") -> Params:
    """A SwiGLU feed-forward of hidden ``width`` for ``n`` stacked layers: ``{prefix}gate``, ``{prefix}up``,
    ``{prefix}down``."""
    D, dt = cfg.d_model, cfg.param_dtype
    return {
        f"{prefix}gate": Weight((n, D, width), ("layers", "embed", "mlp"), dt),
        f"{prefix}up": Weight((n, D, width), ("layers", "embed", "mlp"), dt),
        f"{prefix}down": Weight((n, width, D), ("layers", "mlp", "embed"), dt, "out_proj"),
    }
