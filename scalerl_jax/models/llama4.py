"""The MoE decoder as pure functions over a weight pytree: the Llama-4 text model (HF ``Llama4ForCausalLM``,
``arch="llama4"``) and Qwen3-MoE (HF ``Qwen3MoeForCausalLM``, ``arch="qwen3_moe"``: Qwen3's attention, with per-head
q/k norms before rotate-half RoPE on every layer, and softmax-routed experts without a shared one, on every
``moe_every``-th layer except ``mlp_only_layers``; see :mod:`scalerl_jax.models.moe`).

Same dimension legend as :mod:`scalerl_jax.models.layers`, plus E experts and Fe expert width. What differs from
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
over L / P blocks of P layers whose flags are static. The KV-cached pass (decode, prefill) runs its layers
unrolled instead, every flag static, each layer on its own cache buffers.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import layers as nn
from scalerl_jax.models import moe as moe_lib
from scalerl_jax.models.params import Params, attention_specs, embedding_specs, swiglu_specs
from scalerl_jax.sharding import constrain


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


def param_specs(cfg: ModelConfig) -> Params:
    """Every weight, declared once: the attention half of all L layers in ``layers``, the MoE layers' router and
    experts in ``moe``, the dense layers' SwiGLU in ``dense`` (absent when every layer is MoE)."""
    Lm = cfg.n_moe_layers
    specs = embedding_specs(cfg)
    specs["layers"] = attention_specs(cfg, cfg.n_layers)
    specs["moe"] = moe_lib.moe_specs(cfg, Lm)
    if cfg.n_layers - Lm:
        specs["dense"] = swiglu_specs(cfg, cfg.n_layers - Lm, cfg.ffn_dim)
    return specs


# ---- one layer ------------------------------------------------------------------------------------


def temperature_scale(pos_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Per-position query scale of NoPE layers, [B, T, 1, 1]."""
    p = pos_BT.astype(jnp.float32)
    s = jnp.log1p(jnp.floor((p + 1.0) / cfg.attn_floor_scale)) * cfg.attn_scale + 1.0
    return s[:, :, None, None]


def _position_qk(q, k, pos_BT, rope_tables, cfg: ModelConfig, rope: bool):
    """RoPE layer: RoPE (Llama 4: interleaved) then Llama 4's QK norm; NoPE layer: temperature-tuned queries, keys
    untouched. (Qwen3-MoE's weighted q/k norms come before, in :func:`scalerl_jax.models.layers.attention_block`.)"""
    if rope:
        rot = nn.apply_rope_interleaved if cfg.arch == "llama4" else nn.apply_rope  # Qwen3-MoE: rotate-half
        q, k = rot(q, *rope_tables), rot(k, *rope_tables)
        if cfg.qk_norm:
            q, k = nn.l2_norm(q, cfg.rms_eps), nn.l2_norm(k, cfg.rms_eps)
    elif cfg.attn_temp_tuning:
        q = (q.astype(jnp.float32) * temperature_scale(pos_BT, cfg)).astype(q.dtype)
    return q, k


def _layer(x, lp, fp, pos, cache=None, *, cfg: ModelConfig, rope, is_moe: bool):
    """One decoder layer; ``rope`` is a static bool or a traced per-layer flag (one scan over every layer: both
    position variants are computed and selected). Returns (x, the updated cache or None, router stats or None)."""
    rope_tables = nn.rope_tables(pos, nn.rope_inv_freq(cfg))  # positions only: hoisted out of the layer loop
    if isinstance(rope, bool):
        def position(q, k):
            return _position_qk(q, k, pos, rope_tables, cfg, rope)

        local = cfg.local_attn_chunk if (rope and cfg.local_attn_chunk) else 0
    else:
        def position(q, k):
            qr, kr = _position_qk(q, k, pos, rope_tables, cfg, True)
            qn, kn = _position_qk(q, k, pos, rope_tables, cfg, False)
            return jnp.where(rope, qr, qn), jnp.where(rope, kr, kn)

        local = jnp.where(rope, cfg.local_attn_chunk or 0, 0).astype(jnp.int32)
    with jax.named_scope("layer"):
        x, cache = nn.attention_block(x, lp, pos, position, cfg, cache, local)
        if not is_moe:
            return nn.ffn_block(x, lp["mlp_norm"], fp, cfg), cache, None
        with jax.named_scope("moe"):
            y, stats = moe_lib.moe_ffn(nn.rms_norm(x, lp["mlp_norm"], cfg.rms_eps), fp, cfg)
        return constrain(x + y.astype(x.dtype), ("batch", "seq", "act_embed")), cache, stats


def _blocked(tree, nb: int):
    return jax.tree.map(lambda a: a.reshape(nb, a.shape[0] // nb, *a.shape[1:]), tree)


def _run_uniform(params: Params, x, pos, cfg: ModelConfig):
    """Every layer MoE (Scout): one scan over the L layers with the RoPE / NoPE choice as a traced per-layer
    flag. Both attention variants are computed and selected (cheap next to the layer), but the parameters and
    their gradients stay in the stacked [L, ...] layout: the blocked scan made XLA keep per-position gradient
    stacks plus [L / P, P] and [L] copies of every expert weight's gradient (~3 x 24 GB per device for Scout)."""
    ropes = [cfg.uses_rope(i) for i in range(cfg.n_layers)]
    static_rope = ropes[0] if len(set(ropes)) == 1 else None

    def layer(x, lp, fp, pos, rope):
        return _layer(x, lp, fp, pos, cfg=cfg, rope=static_rope if static_rope is not None else rope, is_moe=True)

    if cfg.remat:
        layer = nn.remat_layer(layer, nn.dtype(cfg.dtype))
    xs = {"layers": params["layers"], "moe": params["moe"], "rope": jnp.asarray(ropes)}

    def body(x, lx):
        x, _, stats = layer(x, lx["layers"], lx["moe"], pos, lx["rope"])
        return x, {"load": stats["load"], "prob": stats["prob"], "kept": stats["kept"]}

    x, stats = jax.lax.scan(body, x, xs, unroll=not cfg.remat)
    return x, stats


def _run_layers(params: Params, x, pos, cfg: ModelConfig):
    """Scan the L / P blocks of ``period(cfg)`` layers. Returns (x, stacked router stats)."""
    if all(cfg.is_moe_layer(i) for i in range(cfg.n_layers)):
        return _run_uniform(params, x, pos, cfg)
    p = period(cfg)
    nb = cfg.n_layers // p
    kinds = [(cfg.uses_rope(j), cfg.is_moe_layer(j)) for j in range(p)]
    fns = {}
    for rope, is_moe in set(kinds):
        f = functools.partial(_layer, cfg=cfg, rope=rope, is_moe=is_moe)
        if cfg.remat:
            f = nn.remat_layer(f, nn.dtype(cfg.dtype))
        fns[(rope, is_moe)] = f
    xs = {"layers": _blocked(params["layers"], nb), "moe": _blocked(params["moe"], nb), "blk": jnp.arange(nb)}
    if "dense" in params:
        xs["dense"] = _blocked(params["dense"], nb)

    def body(x, blk):
        loads, probs, kepts = [], [], []
        i_dense = i_moe = 0
        for j, (rope, is_moe) in enumerate(kinds):
            lp = jax.tree.map(lambda a: a[j], blk["layers"])
            if is_moe:
                fp = jax.tree.map(lambda a: a[i_moe], blk["moe"])
                i_moe += 1
            else:
                fp = jax.tree.map(lambda a: a[i_dense], blk["dense"])
                i_dense += 1
            x, _, stats = fns[(rope, is_moe)](x, lp, fp, pos)
            if stats is not None:
                loads.append(stats["load"])
                probs.append(stats["prob"])
                kepts.append(stats["kept"])
        return x, {"load": jnp.stack(loads), "prob": jnp.stack(probs), "kept": jnp.stack(kepts)}

    x, ys = jax.lax.scan(body, x, xs, unroll=not cfg.remat)
    stats = {"load": ys["load"].reshape(-1, cfg.n_experts), "prob": ys["prob"].reshape(-1, cfg.n_experts),
             "kept": ys["kept"].reshape(-1)}
    return x, stats


def forward_hidden(params: Params, tokens_BT: jax.Array, cfg: ModelConfig, positions_BT=None,
                   return_aux: bool = False):
    """Final-norm hidden states [B, T, D]; with ``return_aux`` also the router stats
    ``{"load": [Lm, E], "prob": [Lm, E], "kept": [Lm]}`` (see :func:`scalerl_jax.models.moe.moe_ffn`)."""
    B, T = tokens_BT.shape
    pos = jnp.broadcast_to(jnp.arange(T), (B, T)) if positions_BT is None else positions_BT
    x, stats = _run_layers(params, nn.embed(params["embed"], tokens_BT, cfg), pos, cfg)
    h = nn.rms_norm(x, params["final_norm"], cfg.rms_eps)
    return (h, stats) if return_aux else h


def forward_cached(params: Params, tokens_BT, positions_BT, cache, cfg: ModelConfig) -> tuple[jax.Array, Any]:
    """KV-cached pass (contract: :func:`scalerl_jax.models.model.forward_cached`). The layers run unrolled, each
    with its static RoPE / NoPE and MoE / dense kind and its own cache buffers (written in place; a rolled scan
    would copy each layer's slice out of a stacked cache at every step)."""
    x = nn.embed(params["embed"], tokens_BT, cfg)
    out, n_moe, n_dense = [], 0, 0
    for i in range(cfg.n_layers):
        is_moe = cfg.is_moe_layer(i)
        if is_moe:
            fp, n_moe = jax.tree.map(lambda a, j=n_moe: a[j], params["moe"]), n_moe + 1
        else:
            fp, n_dense = jax.tree.map(lambda a, j=n_dense: a[j], params["dense"]), n_dense + 1
        lp = jax.tree.map(lambda a, i=i: a[i], params["layers"])
        x, c, _ = _layer(x, lp, fp, positions_BT, cache[i], cfg=cfg, rope=cfg.uses_rope(i), is_moe=is_moe)
        out.append(c)
    return nn.rms_norm(x, params["final_norm"], cfg.rms_eps), tuple(out)
