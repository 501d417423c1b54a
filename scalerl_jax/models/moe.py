"""Mixture-of-experts feed-forward of Llama 4 (sigmoid top-k router, routed experts, shared expert) and Qwen3-MoE
(softmax top-k router, routed experts).

Dimension legend: N tokens (flattened B x T), D model width, E experts, F expert width, k experts per token,
X expert-parallel shards (size of the ``expert`` mesh axis), C per-destination send-buffer rows.

Routing follows HF ``Llama4TextMoe``: router logits ``h @ W_r``; the top-k logits go through a sigmoid (the
others score 0); each selected expert receives the token *pre-scaled* by its score, ``e(h * s)``; the outputs
are summed and the shared expert's ``shared(h)`` added. Qwen3-MoE (HF ``Qwen3MoeSparseMoeBlock``) takes the top-k
of ``softmax(logits)`` (renormalised to sum to 1 with ``norm_topk_prob``) and scales each expert's *output*,
``s * e(h)``; it has no shared expert. ``ModelConfig.arch`` picks the rule (:func:`route`); the dispatch paths below
carry the scores either way (``scale_out``).

Three dispatch paths compute the same function:

* ``dense``: every expert on every token, with score 0 for the unselected ones (an expert of a zero input
  outputs exactly 0). E x the FLOPs; the reference for tiny configs.
* ``ragged``, one shard: assignments sorted by expert, one grouped matmul per projection
  (``jax.lax.ragged_dot``), results scattered back.
* ``ragged`` under a mesh whose ``expert`` axis is > 1: expert parallelism inside ``shard_map``. Tokens are
  sharded over the batch axes (which include ``expert``), experts over ``expert``. Each shard sorts its
  assignments by destination shard into a fixed [X, C] send buffer, one ``all_to_all`` over ``expert`` delivers
  them, the receiver runs its local experts with ``ragged_dot``, and a second ``all_to_all`` brings the results
  back to be combined. ``C`` is the worst case (dropless) unless ``ModelConfig.moe_capacity_factor`` is set,
  in which case assignments past a destination's buffer are dropped (their contribution is 0) and counted.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from scalerl_jax import sharding as shd
from scalerl_jax.config import ConfigError, ModelConfig
from scalerl_jax.models import layers as nn
from scalerl_jax.models.params import Weight, swiglu_specs


def moe_specs(cfg: ModelConfig, n_layers: int) -> dict[str, Weight]:
    """The router [Lm, D, E], the routed experts [Lm, E, ...] and (Llama 4) the shared expert of ``n_layers`` MoE
    layers."""
    D, E, F, dt = cfg.d_model, cfg.n_experts, cfg.expert_ffn_dim, cfg.param_dtype
    shared = swiglu_specs(cfg, n_layers, F, prefix="shared_") if cfg.shared_expert else {}
    return {
        "router": Weight((n_layers, D, E), ("layers", "embed", None), dt),
        "w_gate": Weight((n_layers, E, D, F), ("layers", "experts", "embed", "mlp"), dt),
        "w_up": Weight((n_layers, E, D, F), ("layers", "experts", "embed", "mlp"), dt),
        "w_down": Weight((n_layers, E, F, D), ("layers", "experts", "mlp", "embed"), dt, "out_proj"),
        **shared,
    }


def route(h_ND: jax.Array, w_router_DE: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Router logits [N, E] (float32), the top-k expert ids [N, k] and their scores [N, k]: sigmoid of the top-k
    logits (Llama 4), or the top-k of the softmax, renormalised with ``norm_topk_prob`` (Qwen3-MoE)."""
    logits = jnp.dot(h_ND.astype(jnp.float32), w_router_DE.astype(jnp.float32))
    if cfg.arch == "llama4":
        top, idx = jax.lax.top_k(logits, cfg.top_k)
        return logits, idx, jax.nn.sigmoid(top)
    top, idx = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), cfg.top_k)
    if cfg.norm_topk_prob:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    return logits, idx, top


def _dense_experts(h_ND, idx_Nk, s_Nk, wg, wu, wd, scale_out: bool):
    """Every expert on every token (unselected experts score 0: a zero input, or a zero output weight)."""
    E = wg.shape[0]
    s_NE = jnp.sum(jax.nn.one_hot(idx_Nk, E, dtype=jnp.float32) * s_Nk[..., None], axis=1)
    s_EN1 = s_NE.T[..., None].astype(h_ND.dtype)
    x_END = jnp.broadcast_to(h_ND[None], (E, *h_ND.shape)) if scale_out else h_ND[None] * s_EN1
    g = jnp.einsum("end,edf->enf", x_END, wg)
    u = jnp.einsum("end,edf->enf", x_END, wu)
    a = jax.nn.silu(g) * u
    if scale_out:  # s * down(a) = down(s * a): scale the hidden activation, one contraction over (e, f)
        a = a * s_EN1
    return jnp.einsum("enf,efd->nd", a, wd)


def _grouped_mlp(x_MD, group_sizes, wg, wu, wd):
    """Rows of ``x_MD`` sorted by expert (``group_sizes[e]`` rows for expert e, then unused rows) through
    their expert's SwiGLU with grouped matmuls; unused rows give 0."""
    g = jax.lax.ragged_dot(x_MD, wg, group_sizes)
    u = jax.lax.ragged_dot(x_MD, wu, group_sizes)
    y = jax.lax.ragged_dot(jax.nn.silu(g) * u, wd, group_sizes)
    used = jnp.arange(x_MD.shape[0]) < jnp.sum(group_sizes)
    return jnp.where(used[:, None], y, 0).astype(x_MD.dtype)


def _ragged_experts(h_ND, idx_Nk, s_Nk, wg, wu, wd, scale_out: bool):
    """Sort assignments by expert, grouped matmuls, scatter-add back (one shard holds every expert)."""
    N, k = idx_Nk.shape
    E = wg.shape[0]
    e = idx_Nk.reshape(-1)
    order = jnp.argsort(e, stable=True)
    tok = (jnp.arange(N * k) // k)[order]
    s = s_Nk.reshape(-1)[order][:, None].astype(h_ND.dtype)
    x = h_ND[tok] if scale_out else h_ND[tok] * s
    y = _grouped_mlp(x, jnp.bincount(e, length=E).astype(jnp.int32), wg, wu, wd)
    return jnp.zeros_like(h_ND).at[tok].add(y * s if scale_out else y)


def _ep_local(x_BTD, idx_BTk, s_BTk, wg, wu, wd, *, n_ep: int, capacity_factor,
              embed_axes: tuple[str, ...], tensor_axes: tuple[str, ...], scale_out: bool):
    """One expert-parallel shard: its tokens [B', T, D] and its experts [E/X, D', F']."""
    B, T, D = x_BTD.shape
    k = idx_BTk.shape[-1]
    if embed_axes:  # FSDP-sharded expert weights: gather the model dimension for this layer
        wg = jax.lax.all_gather(wg, embed_axes, axis=1, tiled=True)
        wu = jax.lax.all_gather(wu, embed_axes, axis=1, tiled=True)
        wd = jax.lax.all_gather(wd, embed_axes, axis=2, tiled=True)
    e_loc = wg.shape[0]
    n = B * T * k
    x_ND = x_BTD.reshape(B * T, D)
    e = idx_BTk.reshape(-1)
    order = jnp.argsort(e, stable=True)
    e_s = e[order]
    tok_s = (jnp.arange(n) // k)[order]
    s_s = s_BTk.reshape(-1)[order]
    c = n if capacity_factor is None else max(1, math.ceil(capacity_factor * n / n_ep))
    dest = e_s // e_loc
    counts = jnp.bincount(dest, length=n_ep)
    rank = jnp.arange(n) - (jnp.cumsum(counts) - counts)[dest]
    keep = rank < c
    slot = jnp.where(keep, dest * c + rank, n_ep * c)  # overflow goes to a dump row that is never sent
    s_col = s_s[:, None].astype(x_ND.dtype)
    send_x = jnp.zeros((n_ep * c + 1, D), x_ND.dtype).at[slot].set(x_ND[tok_s] if scale_out else x_ND[tok_s] * s_col)
    send_e = jnp.full((n_ep * c + 1,), e_loc, jnp.int32).at[slot].set((e_s % e_loc).astype(jnp.int32))
    recv_x = jax.lax.all_to_all(send_x[:-1], "expert", 0, 0, tiled=True)  # [X * C, D], grouped by source
    recv_e = jax.lax.all_to_all(send_e[:-1], "expert", 0, 0, tiled=True)  # local expert id, e_loc = empty
    order2 = jnp.argsort(recv_e, stable=True)
    sizes = jnp.bincount(recv_e, length=e_loc + 1)[:e_loc].astype(jnp.int32)
    y_sorted = _grouped_mlp(recv_x[order2], sizes, wg, wu, wd)
    y_recv = jnp.zeros_like(recv_x).at[order2].set(y_sorted)
    if tensor_axes:  # the expert width is sharded: the down projection produced partial sums
        y_recv = jax.lax.psum(y_recv, tensor_axes)
    y_back = jax.lax.all_to_all(y_recv, "expert", 0, 0, tiled=True)  # back in this shard's send layout
    y_assign = jnp.where(keep[:, None], y_back[jnp.minimum(slot, n_ep * c - 1)], 0)
    if scale_out:  # the scores stay with the sender: results come back unscaled
        y_assign = y_assign * s_col
    out = jnp.zeros_like(x_ND).at[tok_s].add(y_assign)
    kept = jnp.zeros((B * T,), jnp.float32).at[tok_s].add(keep.astype(jnp.float32)) / k
    return out.reshape(B, T, D), kept.reshape(B, T)


def _expert_parallel(h_BTD, idx_BTk, s_BTk, wg, wu, wd, cfg: ModelConfig, mesh, rules):
    n_ep = mesh.shape["expert"]
    if cfg.n_experts % n_ep:
        raise ConfigError(f"ModelConfig.n_experts ({cfg.n_experts}) must be divisible by the mesh's expert axis "
                          f"({n_ep}) for expert parallelism")
    axes = {k: w.axes[1:] for k, w in moe_specs(cfg, 1).items()}  # one layer's expert weights
    x_spec = shd.logical_to_spec(("batch", "seq", None), h_BTD.shape, mesh, rules)
    w_spec = shd.logical_to_spec(axes["w_gate"], wg.shape, mesh, rules)
    wd_spec = shd.logical_to_spec(axes["w_down"], wd.shape, mesh, rules)
    if shd.as_axes(w_spec[0]) != ("expert",):
        raise ConfigError(f"expert weights {tuple(wg.shape)} do not shard their expert dimension over the mesh's "
                          f"expert axis (spec {w_spec}); check ShardingRules.experts")
    embed_axes, tensor_axes = shd.as_axes(w_spec[1]), shd.as_axes(w_spec[2])
    tok_spec = P(x_spec[0], x_spec[1], None)
    fn = jax.shard_map(
        lambda x, i, s, g, u, d: _ep_local(x, i, s, g, u, d, n_ep=n_ep,
                                           capacity_factor=cfg.moe_capacity_factor, embed_axes=embed_axes,
                                           tensor_axes=tensor_axes, scale_out=cfg.arch != "llama4"),
        mesh=mesh, in_specs=(x_spec, tok_spec, tok_spec, w_spec, w_spec, wd_spec),
        out_specs=(x_spec, P(x_spec[0], x_spec[1])), check_vma=False,
    )
    return fn(h_BTD, idx_BTk, s_BTk, wg, wu, wd)


def moe_ffn(h_BTD: jax.Array, mp: dict[str, jax.Array], cfg: ModelConfig) -> tuple[jax.Array, dict[str, Any]]:
    """The MoE feed-forward of one layer; returns (output [B, T, D], router stats).

    Stats: ``load`` [E], the fraction of this layer's token-expert assignments that went to each expert (no
    gradient), ``prob`` [E], the mean over tokens of ``softmax(router logits)`` (differentiable: the ``P_e`` of
    the load-balancing loss, :func:`load_balancing_loss`), and ``kept`` (scalar), the fraction not dropped by a
    capacity limit (1 when dropless).
    """
    dt = nn.dtype(cfg.dtype)
    B, T, D = h_BTD.shape
    E, k = cfg.n_experts, cfg.top_k
    logits, idx, s = route(h_BTD.reshape(B * T, D), mp["router"], cfg)
    scale_out = cfg.arch != "llama4"  # Qwen3-MoE weighs expert outputs, Llama 4 expert inputs
    wg, wu, wd = mp["w_gate"].astype(dt), mp["w_up"].astype(dt), mp["w_down"].astype(dt)
    active = shd.current_mesh()
    kept = jnp.float32(1.0)
    if cfg.moe_impl == "dense":
        routed = _dense_experts(h_BTD.reshape(B * T, D), idx, s, wg, wu, wd, scale_out).reshape(B, T, D)
    elif active is not None and active[0].shape.get("expert", 1) > 1:
        routed, kept_BT = _expert_parallel(h_BTD, idx.reshape(B, T, k), s.reshape(B, T, k), wg, wu, wd, cfg,
                                           *active)
        kept = jnp.mean(kept_BT)
    else:
        routed = _ragged_experts(h_BTD.reshape(B * T, D), idx, s, wg, wu, wd, scale_out).reshape(B, T, D)
    load = jnp.mean(jnp.sum(jax.nn.one_hot(idx, E, dtype=jnp.float32), axis=1), axis=0) / k
    prob = jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)
    stats = {"load": load, "prob": prob, "kept": kept}
    if not cfg.shared_expert:
        return routed.astype(h_BTD.dtype), stats
    shared = nn.swiglu(h_BTD, mp["shared_gate"], mp["shared_up"], mp["shared_down"], dt)
    return shared + routed.astype(shared.dtype), stats


def load_balancing_loss(load_LE: jax.Array, prob_LE: jax.Array, top_k: int) -> jax.Array:
    """Switch-Transformer auxiliary load-balancing loss over the MoE layers, as HF transformers'
    ``load_balancing_loss_func`` (Mixtral; the loss ``router_aux_loss_coef`` weighs in HF's Llama-4 config):

        loss = E * sum_e f_e * P_e,   f_e = top-k assignments to e / tokens,   P_e = mean softmax(logits)_e

    with f and P pooled over every token of every MoE layer (each layer sees the same tokens, so pooling is the
    mean over layers). ``load_LE`` is :func:`moe_ffn`'s ``load`` (assignment shares summing to 1 per layer, so
    f = top_k * load); ``prob_LE`` its ``prob``. The gradient flows through P only (f is a count). Uniform routing
    gives ``top_k``; the router is not the sigmoid Llama-4 scores with, but the full softmax HF's function takes."""
    E = load_LE.shape[-1]
    f_E = jax.lax.stop_gradient(load_LE).mean(0) * top_k
    return E * jnp.sum(f_E * prob_LE.mean(0))
