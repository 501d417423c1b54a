"""Dense Llama decoder as pure functions over a weight pytree (``arch="llama4"`` configs are dispatched to
:mod:`scalerl_jax.models.llama4`, which reuses the building blocks here).

Dimension legend (shape suffixes on array names):
    B batch, T time (query positions), S cache slots (key positions), D model width,
    H query heads, K kv heads, G query heads per kv head (H = K * G), Dh head dim,
    F ffn width, V vocab, L layers.

Parameters (layers stacked on a leading L axis so the depth is a ``lax.scan``):
    embed [V, D]; layers: attn_norm [L, D], wq [L, D, H, Dh], wk [L, D, K, Dh], wv [L, D, K, Dh],
    wo [L, H, Dh, D], mlp_norm [L, D], w_gate [L, D, F], w_up [L, D, F], w_down [L, F, D];
    final_norm [D]; lm_head [D, V] (absent when embeddings are tied).

The LM head always receives float32 inputs and weights when ``cfg.head_dtype == "float32"`` (the
ScaleRL FP32-logits fix), for training and for generation alike: both call :func:`lm_logits`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.sharding import constrain

Params = dict[str, Any]
KVCache = dict[str, jax.Array]  # {"k": [L, B, S, K, Dh], "v": [L, B, S, K, Dh]}

PARAM_AXES: dict[str, Any] = {
    "embed": ("vocab", "embed"),
    "layers": {
        "attn_norm": ("layers", "norm"),
        "wq": ("layers", "embed", "q_heads", "head_dim"),
        "wk": ("layers", "embed", "kv_heads", "head_dim"),
        "wv": ("layers", "embed", "kv_heads", "head_dim"),
        "wo": ("layers", "q_heads", "head_dim", "embed"),
        "mlp_norm": ("layers", "norm"),
        "w_gate": ("layers", "embed", "mlp"),
        "w_up": ("layers", "embed", "mlp"),
        "w_down": ("layers", "mlp", "embed"),
    },
    "final_norm": ("norm",),
    "lm_head": ("embed", "vocab"),
}
CACHE_AXES = ("layers", "batch", "seq", "kv_heads", "head_dim")


def _dt(name: str) -> jnp.dtype:
    return jnp.float32 if name == "float32" else jnp.bfloat16


def param_axes(cfg: ModelConfig) -> Params:
    """Logical axis names for every parameter of ``cfg`` (same tree structure as the params)."""
    if cfg.arch == "llama4":
        from scalerl_jax.models import llama4

        return llama4.param_axes(cfg)
    axes = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PARAM_AXES.items()}
    if cfg.tie_embeddings:
        axes.pop("lm_head")
    return axes


def param_shapes(cfg: ModelConfig) -> Params:
    """Shape of every parameter (same tree structure as the params)."""
    if cfg.arch == "llama4":
        from scalerl_jax.models import llama4

        return llama4.param_shapes(cfg)
    L, D, H, K, Dh, F, V = (
        cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim, cfg.vocab_size,
    )
    shapes = {
        "embed": (V, D),
        "layers": {
            "attn_norm": (L, D),
            "wq": (L, D, H, Dh),
            "wk": (L, D, K, Dh),
            "wv": (L, D, K, Dh),
            "wo": (L, H, Dh, D),
            "mlp_norm": (L, D),
            "w_gate": (L, D, F),
            "w_up": (L, D, F),
            "w_down": (L, F, D),
        },
        "final_norm": (D,),
        "lm_head": (D, V),
    }
    if cfg.tie_embeddings:
        shapes.pop("lm_head")
    return shapes


def abstract_params(cfg: ModelConfig) -> Params:
    """ShapeDtypeStructs of the params: AOT compilation without allocating weights."""
    dt = _dt(cfg.param_dtype)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, dt), param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple))


def init_params(cfg: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random init: N(0, std) matrices (out-projections scaled by 1/sqrt(2L)), unit norms."""
    dt = _dt(cfg.param_dtype)
    shapes = param_shapes(cfg)
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(key, len(flat))
    out = []
    for (path, shape), k in zip(flat, keys):
        name = str(path[-1].key)
        if name.endswith("norm"):
            out.append(jnp.ones(shape, dt))
        else:
            scale = std / math.sqrt(2 * cfg.n_layers) if name in ("wo", "w_down", "shared_down") else std
            out.append((scale * jax.random.normal(k, shape, jnp.float32)).astype(dt))
    return jax.tree_util.tree_unflatten(treedef, out)


# ---- building blocks -------------------------------------------------------------------------------


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32, cast back to the input dtype before the gain (as HF Llama does)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype) * y.astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """RoPE inverse frequencies [Dh/2], with Llama-3 frequency scaling when configured."""
    dh = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh))
    rs = cfg.rope_scaling
    if rs is None:
        return inv.astype(np.float32)
    low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    wavelen = 2 * np.pi / inv
    # long wavelengths are slowed down by `factor`, short ones kept, the band between interpolated
    scaled = np.where(wavelen > low_wavelen, inv / rs.factor, inv)
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    mid = (1 - smooth) * scaled / rs.factor + smooth * scaled
    is_mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(is_mid, mid, scaled).astype(np.float32)


def apply_rope(x_BTHD: jax.Array, pos_BT: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half RoPE (HF convention: the two halves of the head dim form the complex pairs)."""
    ang_BTF = pos_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    cos = jnp.cos(jnp.concatenate([ang_BTF, ang_BTF], -1))[:, :, None, :]
    sin = jnp.sin(jnp.concatenate([ang_BTF, ang_BTF], -1))[:, :, None, :]
    x = x_BTHD.astype(jnp.float32)
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x * cos + rot * sin).astype(x_BTHD.dtype)


def _attend(q_BTKGD, k_BSKD, v_BSKD, mask_BTS) -> jax.Array:
    """Softmax attention in float32 for one block of queries; returns [B, T, K, G, Dh]."""
    scale = 1.0 / math.sqrt(q_BTKGD.shape[-1])
    s = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, k_BSKD, preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask_BTS[:, None, None], s, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1).astype(v_BSKD.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", p, v_BSKD)


_NEG = float(np.finfo(np.float32).min)


def _blocks(x, n: int, c: int, fill):
    """[B, n*c - pad, ...] -> [n, B, c, ...], padding the time axis with ``fill``."""
    pad = n * c - x.shape[1]
    if pad:
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
    return jnp.moveaxis(x.reshape(x.shape[0], n, c, *x.shape[2:]), 1, 0)


_NO_CHUNK = 2**30  # a chunk size no position reaches: chunked attention switched off


def _has_local(local) -> bool:
    """Whether ``local`` may restrict attention: a traced value (a per-layer flag inside a layer scan) or a
    positive int."""
    return not isinstance(local, int) or local > 0


def causal_mask(qpos_BT, kpos_BS, local=0) -> jax.Array:
    """[B, T, S] visibility: key s is visible to query t iff kpos <= qpos, and, with ``local`` > 0 (Llama-4
    chunked attention), both positions fall in the same ``local``-sized chunk. ``local`` may be a traced int32
    scalar (0 = off for this layer)."""
    mask = kpos_BS[:, None, :] <= qpos_BT[:, :, None]
    if _has_local(local):
        c = jnp.where(jnp.asarray(local) > 0, jnp.asarray(local, jnp.int32), _NO_CHUNK)
        mask &= (kpos_BS[:, None, :] // c) == (qpos_BT[:, :, None] // c)
    return mask


def _flash_scores(qb, kb, qp, kp, scale, local=0):
    """Scaled scores [B, K, G, Cq, Ck] of one (query block, key block) pair and its causal mask."""
    s = jnp.einsum("bckgd,bskd->bkgcs", qb, kb, preferred_element_type=jnp.float32) * scale
    # The barrier ties the mask to this tile's scores: without it XLA hoists the (position-only, hence
    # loop-invariant) masks of all tiles out of the loops, materialising an O(T x S) boolean array.
    s, qp, kp = jax.lax.optimization_barrier((s, qp, kp))
    mask = causal_mask(qp, kp, local)[:, None, None]
    return s, mask


def _flash_fwd_blocks(q, k, v, qpos, kpos, local, cq, ck):
    """Online-softmax attention over (query block x key block) tiles: peak score memory is one
    [B, K, G, cq, ck] float32 tile. Returns blocked outputs [N, B, cq, K, G, Dh] and the row
    log-sum-exp [N, B, K, G, cq] (needed by the backward pass)."""
    B, T, K, G, Dh = q.shape
    S = k.shape[1]
    n, m = -(-T // cq), -(-S // ck)
    scale = 1.0 / math.sqrt(Dh)
    # padded queries see nothing (position -1), padded keys are never visible (position int32 max)
    qb, qpb = _blocks(q, n, cq, 0), _blocks(qpos.astype(jnp.int32), n, cq, -1)
    kb, vb = _blocks(k, m, ck, 0), _blocks(v, m, ck, 0)
    kpb = _blocks(kpos.astype(jnp.int32), m, ck, np.iinfo(np.int32).max)

    def q_block(args):
        qi, qpi = args

        def k_step(carry, xs):
            mx, l, acc = carry
            ki, vi, kpi = xs
            s, mask = _flash_scores(qi, ki, qpi, kpi, scale, 0 if local is None else local)
            s = jnp.where(mask, s, _NEG)
            mx_new = jnp.maximum(mx, s.max(-1))
            p = jnp.where(mask, jnp.exp(s - mx_new[..., None]), 0.0)
            corr = jnp.exp(mx - mx_new)
            l = l * corr + p.sum(-1)
            pv = jnp.einsum("bkgcs,bskd->bkgcd", p.astype(vi.dtype), vi, preferred_element_type=jnp.float32)
            return (mx_new, l, acc * corr[..., None] + pv), None

        init = (jnp.full((B, K, G, cq), _NEG, jnp.float32), jnp.zeros((B, K, G, cq), jnp.float32),
                jnp.zeros((B, K, G, cq, Dh), jnp.float32))
        (mx, l, acc), _ = jax.lax.scan(k_step, init, (kb, vb, kpb))
        l_safe = jnp.where(l > 0, l, 1.0)  # a query that sees no key (padding) outputs 0
        o = jnp.einsum("bkgcd->bckgd", acc / l_safe[..., None]).astype(q.dtype)
        return o, mx + jnp.log(l_safe)

    o_blocks, lse = jax.lax.map(q_block, (qb, qpb))
    return o_blocks, lse, (qb, qpb, kb, vb, kpb)


def _unblock(x_NBC, T: int):
    x = jnp.moveaxis(x_NBC, 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :T]


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _flash(q, k, v, qpos, kpos, local, cq: int, ck: int):
    return _unblock(_flash_fwd_blocks(q, k, v, qpos, kpos, local, cq, ck)[0], q.shape[1])


def _flash_fwd(q, k, v, qpos, kpos, local, cq, ck):
    o_blocks, lse, blocks = _flash_fwd_blocks(q, k, v, qpos, kpos, local, cq, ck)
    return _unblock(o_blocks, q.shape[1]), (o_blocks, lse, blocks, qpos, kpos, local)


def _flash_bwd(cq, ck, res, do):
    """Flash-attention backward: recompute each score tile from the saved log-sum-exp; dK and dV are
    accumulated in float32 over query blocks, dQ over key blocks."""
    o_blocks, lse, (qb, qpb, kb, vb, kpb), qpos, kpos, local = res
    T, S = qpos.shape[1], kpos.shape[1]
    n, B, _, K, G, Dh = qb.shape
    scale = 1.0 / math.sqrt(Dh)
    dob = _blocks(do, n, cq, 0).astype(qb.dtype)
    delta = jnp.einsum("nbckgd,nbckgd->nbkgc", dob.astype(jnp.float32), o_blocks.astype(jnp.float32))

    def q_block(dkv, xs):
        qi, qpi, doi, lsei, di = xs

        def k_step(dq, ys):
            ki, vi, kpi = ys
            s, mask = _flash_scores(qi, ki, qpi, kpi, scale, 0 if local is None else local)
            p = jnp.where(mask, jnp.exp(s - lsei[..., None]), 0.0)
            dv = jnp.einsum("bkgcs,bckgd->bskd", p.astype(doi.dtype), doi, preferred_element_type=jnp.float32)
            dp = jnp.einsum("bckgd,bskd->bkgcs", doi, vi, preferred_element_type=jnp.float32)
            ds = (p * (dp - di[..., None]) * scale).astype(qi.dtype)
            dq = dq + jnp.einsum("bkgcs,bskd->bckgd", ds, ki, preferred_element_type=jnp.float32)
            dk = jnp.einsum("bkgcs,bckgd->bskd", ds, qi, preferred_element_type=jnp.float32)
            return dq, (dk, dv)

        dq, (dk, dv) = jax.lax.scan(k_step, jnp.zeros(qi.shape, jnp.float32), (kb, vb, kpb))
        return (dkv[0] + dk, dkv[1] + dv), dq.astype(qi.dtype)

    zeros = jnp.zeros(kb.shape, jnp.float32)
    (dk, dv), dq = jax.lax.scan(q_block, (zeros, zeros), (qb, qpb, dob, lse, delta))
    return (_unblock(dq, T), _unblock(dk, S).astype(kb.dtype), _unblock(dv, S).astype(vb.dtype),
            np.zeros(qpos.shape, jax.dtypes.float0), np.zeros(kpos.shape, jax.dtypes.float0),
            None if local is None else np.zeros(np.shape(local), jax.dtypes.float0))


_flash.defvjp(_flash_fwd, _flash_bwd)


def attention(q_BTHD, k_BSKD, v_BSKD, qpos_BT, kpos_BS, chunk: int, local=0) -> jax.Array:
    """Causal GQA attention (key s visible to query t iff kpos <= qpos; with ``local`` > 0 also only within the
    same ``local``-position chunk, Llama 4's chunked attention), memory-bounded.

    Short inputs (T and S both <= ``chunk``) take one dense softmax. Longer ones run a flash-style
    online softmax over tiles of ``chunk`` queries x ``chunk`` keys (ragged lengths are padded), with a
    custom backward pass that recomputes each tile from the saved log-sum-exp: neither pass ever holds
    more than one [B, K, G, chunk, chunk] score tile, so memory is linear in the sequence length.
    """
    B, T, H, Dh = q_BTHD.shape
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    q = q_BTHD.reshape(B, T, K, H // K, Dh)
    if T <= chunk and S <= chunk:
        return _attend(q, k_BSKD, v_BSKD, causal_mask(qpos_BT, kpos_BS, local)).reshape(B, T, H, Dh)
    loc = jnp.asarray(local, jnp.int32) if _has_local(local) else None
    o = _flash(q, k_BSKD, v_BSKD, qpos_BT, kpos_BS, loc, min(chunk, T), min(chunk, S))
    return o.reshape(B, T, H, Dh)


def _proj(x, w, n_in: int = 1, preferred_element_type=None) -> jax.Array:
    """``x [..., *In] @ w [*In, *Out] -> [..., *Out]`` as one 2-D matmul over the flattened leading axes.

    Why not ``einsum("btd,dhk->bthk")``: its weight gradient contracts over *two* axes (b, t), and XLA:CPU
    lowers that dot by materialising a transposed copy of the activation cotangent inside an elementwise
    loop fusion (strided, TLB-bound: ~10x the cost of the matmul itself), which made the tiny model's
    backward pass ~10x its forward. With the leading axes flattened first, the gradient is a plain
    [N, In]^T @ [N, Out] matmul that the CPU dot library takes without a transpose.
    """
    k_in = math.prod(w.shape[:n_in])
    y = jnp.dot(x.reshape(-1, k_in), w.reshape(k_in, -1), preferred_element_type=preferred_element_type)
    return y.reshape(*x.shape[: x.ndim - n_in], *w.shape[n_in:])


def attend_with_cache(q, k, v, pos_BT, kv, cfg: ModelConfig, local=0):
    """Causal attention of one layer. Without a cache (``kv`` None) over ``k``/``v`` themselves; with one
    (cache_k, cache_v [B, S, K, Dh]) the new keys/values are written at slot = position first and the queries
    attend over every slot. Returns (output [B, T, H, Dh], the updated cache or None)."""
    if kv is None:
        return attention(q, k, v, pos_BT, pos_BT, cfg.attn_chunk, local), None
    dt = _dt(cfg.dtype)
    ck, cv = kv
    B = q.shape[0]
    b_idx = jnp.arange(B)[:, None]
    ck = ck.at[b_idx, pos_BT].set(k.astype(ck.dtype))
    cv = cv.at[b_idx, pos_BT].set(v.astype(cv.dtype))
    slots = jnp.broadcast_to(jnp.arange(ck.shape[1]), (B, ck.shape[1]))
    o = attention(q, ck.astype(dt), cv.astype(dt), pos_BT, slots, max(cfg.attn_chunk, q.shape[1]), local)
    return o, (ck, cv)


def _layer(x_BTD, lp, pos_BT, cfg: ModelConfig, inv_freq, kv=None):
    """One decoder layer. ``kv``: optional (cache_k [B,S,K,Dh], cache_v) to write into and attend over."""
    dt = _dt(cfg.dtype)
    h = rms_norm(x_BTD, lp["attn_norm"], cfg.rms_eps)
    q = _proj(h, lp["wq"].astype(dt))
    k = _proj(h, lp["wk"].astype(dt))
    v = _proj(h, lp["wv"].astype(dt))
    q = constrain(apply_rope(q, pos_BT, inv_freq), ("batch", "seq", "q_heads", "head_dim"))
    k = apply_rope(k, pos_BT, inv_freq)
    o, new_kv = attend_with_cache(q, k, v, pos_BT, kv, cfg)
    x_BTD = x_BTD + _proj(o, lp["wo"].astype(dt), n_in=2)
    x_BTD = constrain(x_BTD, ("batch", "seq", "act_embed"))
    h = rms_norm(x_BTD, lp["mlp_norm"], cfg.rms_eps)
    g = _proj(h, lp["w_gate"].astype(dt))
    u = _proj(h, lp["w_up"].astype(dt))
    a = constrain(jax.nn.silu(g) * u, ("batch", "seq", "mlp"))
    x_BTD = x_BTD + _proj(a, lp["w_down"].astype(dt))
    return constrain(x_BTD, ("batch", "seq", "act_embed")), new_kv


_BITS = {2: jnp.uint16, 4: jnp.uint32}


def remat_layer(f, x_dtype):
    """``f(x, *args) -> (x_out, *rest)`` rematerialised: the backward pass recomputes ``f`` from its inputs, of
    which it keeps only ``x`` and ``args`` (``jax.checkpoint`` with ``nothing_saveable``, written as a custom VJP).

    The layer input ``x`` (``x_dtype``, the [B, T, D] activation that the layer scan stacks into [L, B, T, D] for
    the backward loop) is saved as its raw bits, an unsigned integer of the same width, and bit-cast back inside
    the backward loop. On GPU/TPU that is a no-op. XLA:CPU emulates bfloat16 by upcasting it, and with a bf16
    stack its while-loop-invariant code motion hoisted that upcast out of the backward loop: a float32 copy of
    every layer's input (15 GiB per device for Scout at 16k tokens) that no accelerator compiler makes, in the
    AOT memory estimate. An integer stack is not upcast, so only the slice of the current layer is.
    """
    bits = _BITS[jnp.dtype(x_dtype).itemsize]

    @jax.custom_vjp
    def g(x, *args):
        return f(x, *args)

    def fwd(x, *args):
        return f(x, *args), (jax.lax.bitcast_convert_type(x, bits), args)

    def bwd(res, ct):
        x_bits, args = res
        _, vjp = jax.vjp(f, jax.lax.bitcast_convert_type(x_bits, x_dtype), *args)
        return vjp(ct)

    g.defvjp(fwd, bwd)
    return g


def _embed(params: Params, tokens_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
    x = jnp.take(params["embed"], tokens_BT, axis=0).astype(_dt(cfg.dtype))
    return constrain(x, ("batch", "seq", "act_embed"))


def forward_hidden(params: Params, tokens_BT: jax.Array, cfg: ModelConfig, positions_BT=None) -> jax.Array:
    """Final-norm hidden states [B, T, D] (compute dtype) for a causal pass without a cache."""
    if cfg.arch == "llama4":
        from scalerl_jax.models import llama4

        return llama4.forward_hidden(params, tokens_BT, cfg, positions_BT)
    B, T = tokens_BT.shape
    pos = jnp.broadcast_to(jnp.arange(T), (B, T)) if positions_BT is None else positions_BT
    inv_freq = rope_inv_freq(cfg)

    def layer(x, lp, pos):
        return _layer(x, lp, pos, cfg, inv_freq)[0]

    if cfg.remat:
        layer = remat_layer(layer, _dt(cfg.dtype))

    def body(x, lp):
        return layer(x, lp, pos), None

    # Without remat, a rolled scan stacks every layer's residuals into [L, ...] buffers (zero-filled, written
    # with dynamic-update-slice, read back with dynamic-slice): on CPU that traffic cost ~1/4 of the backward
    # pass. Unrolled, each layer's residuals are plain buffers. With remat only the [L, B, T, D] layer inputs
    # are stacked, and a rolled loop keeps compile time flat in depth (the 8B preset).
    x, _ = jax.lax.scan(body, _embed(params, tokens_BT, cfg), params["layers"], unroll=not cfg.remat)
    return rms_norm(x, params["final_norm"], cfg.rms_eps)


def head_weight(params: Params, cfg: ModelConfig) -> jax.Array:
    """The LM head as [D, V] (the transposed embedding when tied)."""
    return params["embed"].T if cfg.tie_embeddings else params["lm_head"]


def lm_logits(params: Params, hidden: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Logits from final hidden states, always returned as float32.

    ``head_dtype == "float32"``: inputs and weights are cast to float32 before the matmul (the ScaleRL
    fix). ``"bfloat16"``: the matmul runs in bfloat16 (the ablation), then the result is cast up.
    """
    hdt = _dt(cfg.head_dtype)
    w = head_weight(params, cfg).astype(hdt)
    logits = _proj(hidden.astype(hdt), w, preferred_element_type=hdt)
    return logits.astype(jnp.float32)


def forward(params: Params, tokens_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Float32 logits [B, T, V] of a causal pass over ``tokens_BT``."""
    return lm_logits(params, forward_hidden(params, tokens_BT, cfg), cfg)


# ---- KV-cache interface for the generation engine --------------------------------------------------


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype: str | None = None) -> KVCache:
    """A zeroed KV cache of ``max_len`` slots per sequence."""
    dt = _dt(dtype or cfg.dtype)
    shape = (cfg.n_layers, batch, max_len, cfg.n_kv_heads, cfg.head_dim)
    return {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)}


def forward_cached(
    params: Params, tokens_BT: jax.Array, positions_BT: jax.Array, cache: KVCache, cfg: ModelConfig
) -> tuple[jax.Array, KVCache]:
    """Run ``tokens_BT`` at absolute ``positions_BT`` (per row), writing their keys/values into cache
    slot = position and attending to every slot <= the query position.

    Prefill is a call with positions 0..T-1 (right padding is harmless: a pad's slot is overwritten by
    the real token decoded at that position before any query can see it); decode is a call with T = 1.
    Rows advance independently, so a batch may mix sequences of different lengths. Returns final-norm
    hidden states [B, T, D] (feed the positions you need to :func:`lm_logits`) and the updated cache.
    """
    if cfg.arch == "llama4":
        from scalerl_jax.models import llama4

        return llama4.forward_cached(params, tokens_BT, positions_BT, cache, cfg)
    inv_freq = rope_inv_freq(cfg)

    def body(x, xs):
        lp, ck, cv = xs
        x, (ck, cv) = _layer(x, lp, positions_BT, cfg, inv_freq, (ck, cv))
        return x, (ck, cv)

    x, (k, v) = jax.lax.scan(body, _embed(params, tokens_BT, cfg), (params["layers"], cache["k"], cache["v"]))
    return rms_norm(x, params["final_norm"], cfg.rms_eps), {"k": k, "v": v}
