"""Llama-4 text decoder (HF ``Llama4ForCausalLM``) as pure functions over a weight pytree.

Same dimension legend as :mod:`scalerl_jax.models.llama`, plus E experts and Fe expert width. What differs from
the dense Llama (each switched by a :class:`ModelConfig` field, ``arch="llama4"``):

* MoE feed-forward (:mod:`scalerl_jax.models.moe`) on every ``moe_every``-th layer, a dense SwiGLU of width
  ``ffn_dim`` on the others;
* no RoPE on every ``nope_every``-th layer (NoPE), where instead queries are scaled by
  ``1 + attn_scale * log1p(floor((pos + 1) / attn_floor_scale))`` (attention temperature tuning);
* RoPE layers: RoPE on interleaved pairs (HF Llama 4 rotates (x[2i], x[2i+1]), not the two halves), then a
  weightless RMS norm of q and k (``qk_norm``), and attention restricted to ``local_attn_chunk``-position chunks.

Parameters: ``layers`` holds the attention half of every layer stacked on L (as the dense model); ``dense``
the SwiGLU weights of the dense layers stacked on their own count; ``moe`` the router, the routed experts
[Lm, E, ...] and the shared expert of the MoE layers.

Depth is a ``lax.scan``. When every layer is MoE (Scout) it scans the L layers with the RoPE / NoPE choice as a
traced per-layer flag. With dense layers interleaved, the pattern repeats with a period ``P`` and the scan runs
over L / P blocks of P layers whose flags are static.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import moe as moe_lib
from scalerl_jax.models.llama import (
    PARAM_AXES as DENSE_AXES,
)
from scalerl_jax.models.llama import (
    Params,
    _dt,
    _embed,
    _proj,
    attend_with_cache,
    remat_layer,
    rms_norm,
    rope_inv_freq,
)
from scalerl_jax.sharding import constrain

_ATTN_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm")
_DENSE_KEYS = ("w_gate", "w_up", "w_down")


def period(cfg: ModelConfig) -> int:
    """Smallest P dividing n_layers such that layer i and layer i mod P have the same kind (MoE or dense,
    RoPE or NoPE)."""
    L = cfg.n_layers
    for p in range(1, L + 1):
        if L % p == 0 and all(
            cfg.is_moe_layer(i) == cfg.is_moe_layer(i % p) and cfg.uses_rope(i) == cfg.uses_rope(i % p)
            for i in range(L)
        ):
            return p
    return L


def param_axes(cfg: ModelConfig) -> Params:
    axes: Params = {
        "embed": DENSE_AXES["embed"],
        "layers": {k: DENSE_AXES["layers"][k] for k in _ATTN_KEYS},
        "moe": dict(moe_lib.MOE_AXES),
        "final_norm": DENSE_AXES["final_norm"],
    }
    if cfg.n_layers - cfg.n_moe_layers:
        axes["dense"] = {k: DENSE_AXES["layers"][k] for k in _DENSE_KEYS}
    if not cfg.tie_embeddings:
        axes["lm_head"] = DENSE_AXES["lm_head"]
    return axes


def param_shapes(cfg: ModelConfig) -> Params:
    L, D, H, K, Dh, V = cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size
    Lm = cfg.n_moe_layers
    Ld, F = L - Lm, cfg.ffn_dim
    shapes: Params = {
        "embed": (V, D),
        "layers": {"attn_norm": (L, D), "wq": (L, D, H, Dh), "wk": (L, D, K, Dh), "wv": (L, D, K, Dh),
                   "wo": (L, H, Dh, D), "mlp_norm": (L, D)},
        "moe": moe_lib.moe_shapes(cfg, Lm),
        "final_norm": (D,),
    }
    if Ld:
        shapes["dense"] = {"w_gate": (Ld, D, F), "w_up": (Ld, D, F), "w_down": (Ld, F, D)}
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


# ---- building blocks -------------------------------------------------------------------------------


def apply_rope_interleaved(x_BTHD: jax.Array, pos_BT: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """RoPE on adjacent pairs (x[2i], x[2i+1]) as complex numbers (HF Llama 4 ``apply_rotary_emb``)."""
    ang = pos_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, Dh/2]
    cos, sin = jnp.cos(ang)[:, :, None, :], jnp.sin(ang)[:, :, None, :]
    x = x_BTHD.astype(jnp.float32).reshape(*x_BTHD.shape[:-1], -1, 2)
    re, im = x[..., 0], x[..., 1]
    out = jnp.stack([re * cos - im * sin, re * sin + im * cos], axis=-1)
    return out.reshape(x_BTHD.shape).astype(x_BTHD.dtype)


def l2_norm(x: jax.Array, eps: float) -> jax.Array:
    """Weightless RMS norm over the last axis in float32 (HF ``Llama4TextL2Norm``)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def temperature_scale(pos_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Per-position query scale of NoPE layers, [B, T, 1, 1]."""
    p = pos_BT.astype(jnp.float32)
    s = jnp.log1p(jnp.floor((p + 1.0) / cfg.attn_floor_scale)) * cfg.attn_scale + 1.0
    return s[:, :, None, None]


def _position_qk(q, k, pos_BT, cfg: ModelConfig, inv_freq, rope: bool):
    """RoPE layer: interleaved RoPE then QK norm; NoPE layer: temperature-tuned queries, keys untouched."""
    if rope:
        q = apply_rope_interleaved(q, pos_BT, inv_freq)
        k = apply_rope_interleaved(k, pos_BT, inv_freq)
        if cfg.qk_norm:
            q, k = l2_norm(q, cfg.rms_eps), l2_norm(k, cfg.rms_eps)
    elif cfg.attn_temp_tuning:
        q = (q.astype(jnp.float32) * temperature_scale(pos_BT, cfg)).astype(q.dtype)
    return q, k


def _attn_block(x_BTD, lp, pos_BT, cfg: ModelConfig, inv_freq, rope: bool, kv=None):
    """Attention half of one layer (pre-norm, residual added). ``kv``: optional cache to write and read."""
    dt = _dt(cfg.dtype)
    h = rms_norm(x_BTD, lp["attn_norm"], cfg.rms_eps)
    q = _proj(h, lp["wq"].astype(dt))
    k = _proj(h, lp["wk"].astype(dt))
    v = _proj(h, lp["wv"].astype(dt))
    if isinstance(rope, bool):
        q, k = _position_qk(q, k, pos_BT, cfg, inv_freq, rope)
        local = cfg.local_attn_chunk if (rope and cfg.local_attn_chunk) else 0
    else:  # a traced per-layer flag (one scan over every layer): both variants, selected
        qr, kr = _position_qk(q, k, pos_BT, cfg, inv_freq, True)
        qn, kn = _position_qk(q, k, pos_BT, cfg, inv_freq, False)
        q, k = jnp.where(rope, qr, qn), jnp.where(rope, kr, kn)
        local = jnp.where(rope, cfg.local_attn_chunk or 0, 0).astype(jnp.int32)
    q = constrain(q, ("batch", "seq", "q_heads", "head_dim"))
    o, new_kv = attend_with_cache(q, k, v, pos_BT, kv, cfg, local)
    x_BTD = x_BTD + _proj(o, lp["wo"].astype(dt), n_in=2)
    return constrain(x_BTD, ("batch", "seq", "act_embed")), new_kv


def _ffn_block(x_BTD, lp, fp, cfg: ModelConfig, is_moe: bool):
    """Feed-forward half of one layer; returns (x, router stats or None)."""
    dt = _dt(cfg.dtype)
    h = rms_norm(x_BTD, lp["mlp_norm"], cfg.rms_eps)
    if is_moe:
        y, stats = moe_lib.moe_ffn(h, fp, cfg)
    else:
        a = constrain(jax.nn.silu(_proj(h, fp["w_gate"].astype(dt))) * _proj(h, fp["w_up"].astype(dt)),
                      ("batch", "seq", "mlp"))
        y, stats = _proj(a, fp["w_down"].astype(dt)), None
    return constrain(x_BTD + y.astype(x_BTD.dtype), ("batch", "seq", "act_embed")), stats


def _layer(x, lp, fp, pos, kv, *, cfg: ModelConfig, inv_freq, rope: bool, is_moe: bool):
    x, new_kv = _attn_block(x, lp, pos, cfg, inv_freq, rope, kv)
    x, stats = _ffn_block(x, lp, fp, cfg, is_moe)
    return x, new_kv, stats


def _blocked(tree, nb: int):
    return jax.tree.map(lambda a: a.reshape(nb, a.shape[0] // nb, *a.shape[1:]), tree)


def _run_uniform(params: Params, x, pos, cfg: ModelConfig, cache=None):
    """Every layer MoE (Scout): one scan over the L layers with the RoPE / NoPE choice as a traced per-layer
    flag. Both attention variants are computed and selected (cheap next to the layer), but the parameters and
    their gradients stay in the stacked [L, ...] layout: the blocked scan made XLA keep per-position gradient
    stacks plus [L / P, P] and [L] copies of every expert weight's gradient (~3 x 24 GB per device for Scout)."""
    inv_freq = rope_inv_freq(cfg)
    ropes = [cfg.uses_rope(i) for i in range(cfg.n_layers)]
    static_rope = ropes[0] if len(set(ropes)) == 1 else None

    def layer(x, lp, fp, pos, kv, rope):
        return _layer(x, lp, fp, pos, kv, cfg=cfg, inv_freq=inv_freq,
                      rope=static_rope if static_rope is not None else rope, is_moe=True)

    if cfg.remat and cache is None:
        layer = remat_layer(layer, _dt(cfg.dtype))
    xs = {"layers": params["layers"], "moe": params["moe"], "rope": jnp.asarray(ropes)}
    if cache is not None:
        xs["cache"] = cache

    def body(x, lx):
        kv = None if cache is None else (lx["cache"]["k"], lx["cache"]["v"])
        x, new_kv, stats = layer(x, lx["layers"], lx["moe"], pos, kv, lx["rope"])
        ys = {"load": stats["load"], "kept": stats["kept"]}
        if new_kv is not None:
            ys["cache"] = {"k": new_kv[0], "v": new_kv[1]}
        return x, ys

    x, ys = jax.lax.scan(body, x, xs, unroll=not cfg.remat)
    return x, {"load": ys["load"], "kept": ys["kept"]}, ys.get("cache")


def _run_layers(params: Params, x, pos, cfg: ModelConfig, cache=None):
    """Scan the L / P blocks. Returns (x, stacked router stats, new cache or None)."""
    if cfg.moe_every == 1:
        return _run_uniform(params, x, pos, cfg, cache)
    p = period(cfg)
    nb = cfg.n_layers // p
    kinds = [(cfg.uses_rope(j), cfg.is_moe_layer(j)) for j in range(p)]
    inv_freq = rope_inv_freq(cfg)
    fns = {}
    for rope, is_moe in set(kinds):
        f = functools.partial(_layer, cfg=cfg, inv_freq=inv_freq, rope=rope, is_moe=is_moe)
        if cfg.remat and cache is None:
            f = remat_layer(f, _dt(cfg.dtype))
        fns[(rope, is_moe)] = f
    xs = {"layers": _blocked(params["layers"], nb), "moe": _blocked(params["moe"], nb)}
    if "dense" in params:
        xs["dense"] = _blocked(params["dense"], nb)
    if cache is not None:
        xs["cache"] = _blocked(cache, nb)

    def body(x, blk):
        loads, kepts, ks, vs = [], [], [], []
        i_dense = i_moe = 0
        for j, (rope, is_moe) in enumerate(kinds):
            lp = jax.tree.map(lambda a: a[j], blk["layers"])
            if is_moe:
                fp = jax.tree.map(lambda a: a[i_moe], blk["moe"])
                i_moe += 1
            else:
                fp = jax.tree.map(lambda a: a[i_dense], blk["dense"])
                i_dense += 1
            kv = None if cache is None else (blk["cache"]["k"][j], blk["cache"]["v"][j])
            x, new_kv, stats = fns[(rope, is_moe)](x, lp, fp, pos, kv)
            if stats is not None:
                loads.append(stats["load"])
                kepts.append(stats["kept"])
            if new_kv is not None:
                ks.append(new_kv[0])
                vs.append(new_kv[1])
        ys = {"load": jnp.stack(loads), "kept": jnp.stack(kepts)}
        if cache is not None:
            ys["cache"] = {"k": jnp.stack(ks), "v": jnp.stack(vs)}
        return x, ys

    x, ys = jax.lax.scan(body, x, xs, unroll=not cfg.remat)
    stats = {"load": ys["load"].reshape(-1, cfg.n_experts), "kept": ys["kept"].reshape(-1)}
    new_cache = None
    if cache is not None:
        new_cache = jax.tree.map(lambda a: a.reshape(cfg.n_layers, *a.shape[2:]), ys["cache"])
    return x, stats, new_cache


def forward_hidden(params: Params, tokens_BT: jax.Array, cfg: ModelConfig, positions_BT=None,
                   return_aux: bool = False):
    """Final-norm hidden states [B, T, D]; with ``return_aux`` also the router stats
    ``{"load": [Lm, E], "kept": [Lm]}`` (see :func:`scalerl_jax.models.moe.moe_ffn`)."""
    B, T = tokens_BT.shape
    pos = jnp.broadcast_to(jnp.arange(T), (B, T)) if positions_BT is None else positions_BT
    x, stats, _ = _run_layers(params, _embed(params, tokens_BT, cfg), pos, cfg)
    h = rms_norm(x, params["final_norm"], cfg.rms_eps)
    return (h, stats) if return_aux else h


def forward_cached(params: Params, tokens_BT, positions_BT, cache, cfg: ModelConfig) -> tuple[jax.Array, Any]:
    """KV-cached pass (same contract as :func:`scalerl_jax.models.llama.forward_cached`)."""
    x, _, new_cache = _run_layers(params, _embed(params, tokens_BT, cfg), positions_BT, cfg, cache)
    return rms_norm(x, params["final_norm"], cfg.rms_eps), new_cache
