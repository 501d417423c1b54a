"""The layers every Llama-family model here is built from, as pure functions: the dtype table, projection,
embedding, RMS / L2 norms, RoPE (rotate-half and interleaved), SwiGLU, causal GQA attention (dense, and a
flash-style tiled form with its own backward pass; or the library kernels of :mod:`scalerl_jax.kernels.attention`
chosen by ``ModelConfig.attention_impl``), attention over a KV cache, and layer rematerialisation.

Dimension legend (shape suffixes on array names):
    B batch, T time (query positions), S cache slots / key positions, D model width, H query heads,
    K kv heads, G query heads per kv head (H = K * G), Dh head dim, F ffn width, V vocab, L layers.

KV cache: one ``{"k", "v"}: [B, K, S, Dh]`` per layer (slot = position), a tuple of L. Each layer's keys and values
are a buffer of their own, written in place and read as they are, so a single-token decode step is a plain batched
matmul over (B, K) with no per-layer slice to copy out of a stacked [L, ...] array (that copy cost a third of a CPU
decode step on the ``small`` shape).

Depends on :mod:`scalerl_jax.config` and :mod:`scalerl_jax.sharding` only, and on the top-level :mod:`kernels`
package (imported inside the functions that need it) when ``attention_impl`` is not ``"reference"``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.sharding import constrain, current_mesh, logical_to_spec, per_shard

DTYPES: dict[str, jnp.dtype] = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def dtype(name: str, what: str = "dtype") -> jnp.dtype:
    """The JAX dtype of a config dtype name ("float32" | "bfloat16"); the one table every module uses. ``what``
    names the field in the error."""
    if name not in DTYPES:
        raise ValueError(f"{what} must be one of {tuple(DTYPES)}, got {name!r}")
    return DTYPES[name]


# ---- projections, embedding, norms, feed-forward ---------------------------------------------------


def proj(x, w, n_in: int = 1, preferred_element_type=None) -> jax.Array:
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


def embed(table_VD: jax.Array, tokens_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Token embeddings [B, T, D] in the compute dtype."""
    x = jnp.take(table_VD, tokens_BT, axis=0).astype(dtype(cfg.dtype))
    return constrain(x, ("batch", "seq", "act_embed"))


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32, cast back to the input dtype before the gain (as HF Llama does)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype).reshape((1,) * (x.ndim - 1) + w.shape) * y.astype(x.dtype)


def l2_norm(x: jax.Array, eps: float) -> jax.Array:
    """Weightless RMS norm over the last axis in float32 (HF ``Llama4TextL2Norm``)."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def swiglu(h: jax.Array, w_gate, w_up, w_down, dt, act_axes=None) -> jax.Array:
    """``w_down(silu(w_gate h) * w_up h)`` with weights cast to ``dt``; ``act_axes`` pins the hidden activation's
    sharding (the dense FFN's [B, T, F])."""
    with jax.named_scope("swiglu"):
        a = jax.nn.silu(proj(h, w_gate.astype(dt))) * proj(h, w_up.astype(dt))
        if act_axes is not None:
            a = constrain(a, act_axes)
        return proj(a, w_down.astype(dt))


# ---- rotary position embeddings --------------------------------------------------------------------


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


def rope_tables(pos_BT: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos and sin of every (position, frequency) angle, float32 [B, T, Dh/2]: computed once per forward pass and
    shared by every layer."""
    ang_BTF = pos_BT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    return jnp.cos(ang_BTF), jnp.sin(ang_BTF)


def apply_rope(x_BTHD: jax.Array, cos_BTF: jax.Array, sin_BTF: jax.Array) -> jax.Array:
    """Rotate-half RoPE (HF Llama convention: the two halves of the head dim form the complex pairs)."""
    c = jnp.concatenate([cos_BTF, cos_BTF], -1)[:, :, None, :]
    s = jnp.concatenate([sin_BTF, sin_BTF], -1)[:, :, None, :]
    x = x_BTHD.astype(jnp.float32)
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x * c + rot * s).astype(x_BTHD.dtype)


def apply_rope_interleaved(x_BTHD: jax.Array, cos_BTF: jax.Array, sin_BTF: jax.Array) -> jax.Array:
    """RoPE on adjacent pairs (x[2i], x[2i+1]) as complex numbers (HF Llama 4 ``apply_rotary_emb``)."""
    c, s = cos_BTF[:, :, None, :], sin_BTF[:, :, None, :]
    x = x_BTHD.astype(jnp.float32).reshape(*x_BTHD.shape[:-1], -1, 2)
    re, im = x[..., 0], x[..., 1]
    out = jnp.stack([re * c - im * s, re * s + im * c], axis=-1)
    return out.reshape(x_BTHD.shape).astype(x_BTHD.dtype)


# ---- attention -------------------------------------------------------------------------------------

_NEG = float(np.finfo(np.float32).min)
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


def dense_attention(q_BTKGD, k_BSKD, v_BSKD, mask_BTS) -> jax.Array:
    """Softmax attention in float32 for one block of queries; returns [B, T, K, G, Dh].

    The operands are put in head-major layout first (q as [B, K, G*T, Dh], k and v as [B, K, S, Dh]) so that both
    products, and their gradients, are batched matmuls over (B, K) with the contraction in place: written as one
    einsum over (t, g) the dots needed a transposed copy of an operand or a result on each of their ~8 uses in
    the forward and backward pass (XLA:CPU; ~1/10 of the tiny model's train step)."""
    B, T, K, G, Dh = q_BTKGD.shape
    S = k_BSKD.shape[1]
    scale = 1.0 / math.sqrt(Dh)
    q_BKMD = jnp.transpose(q_BTKGD, (0, 2, 3, 1, 4)).reshape(B, K, G * T, Dh)  # M = (g, t)
    k_BKSD, v_BKSD = jnp.swapaxes(k_BSKD, 1, 2), jnp.swapaxes(v_BSKD, 1, 2)
    s = jnp.einsum("bkmd,bksd->bkms", q_BKMD, k_BKSD, preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask_BTS[:, None, None], s.reshape(B, K, G, T, S), jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1).astype(v_BSKD.dtype).reshape(B, K, G * T, S)
    o_BKMD = jnp.einsum("bkms,bksd->bkmd", p, v_BKSD)
    return jnp.transpose(o_BKMD.reshape(B, K, G, T, Dh), (0, 3, 1, 2, 4))


def _blocks(x, n: int, c: int, fill):
    """[B, n*c - pad, ...] -> [n, B, c, ...], padding the time axis with ``fill``."""
    pad = n * c - x.shape[1]
    if pad:
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=fill)
    return jnp.moveaxis(x.reshape(x.shape[0], n, c, *x.shape[2:]), 1, 0)


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


def _kernel_head_axes(n_q_heads: int, n_kv_heads: int) -> tuple[str | None, str | None]:
    """Logical head axes for a kernel's operands under the active mesh: split the query and key/value heads only
    when the mesh splits both into the same number of blocks (a block of query heads must meet its own kv heads:
    GQA groups them in order); otherwise every device takes all heads of its batch rows."""
    active = current_mesh()
    if active is None:
        return None, None
    mesh, rules = active
    same = (logical_to_spec(("q_heads",), (n_q_heads,), mesh, rules)
            == logical_to_spec(("kv_heads",), (n_kv_heads,), mesh, rules))
    return ("q_heads", "kv_heads") if same else (None, None)


def attention(q_BTHD, k_BSKD, v_BSKD, qpos_BT, kpos_BS, chunk: int, local=0, impl: str = "reference",
              local_chunk: int | None = None) -> jax.Array:
    """Causal GQA attention (key s visible to query t iff kpos <= qpos; with ``local`` > 0 also only within the
    same ``local``-position chunk, Llama 4's chunked attention), memory-bounded.

    ``impl`` is ``ModelConfig.attention_impl``. ``"reference"`` is this function's own pure-JAX path (below);
    ``"cudnn"`` and ``"pallas"`` hand q, k, v to the library kernels in :mod:`scalerl_jax.kernels.attention`, which take
    the positions to be the row indices 0..T-1 (self-attention over whole sequences, the training pass) and
    need ``local_chunk`` (the static chunk size) when ``local`` is a traced per-layer flag.

    Short inputs (T and S both <= ``chunk``) take one dense softmax. Longer ones run a flash-style
    online softmax over tiles of ``chunk`` queries x ``chunk`` keys (ragged lengths are padded), with a
    custom backward pass that recomputes each tile from the saved log-sum-exp: neither pass ever holds
    more than one [B, K, G, chunk, chunk] score tile, so memory is linear in the sequence length.
    """
    if impl != "reference":
        from scalerl_jax.kernels.attention import self_attention  # kept off the import path of reference runs

        if impl == "cudnn":  # JAX partitions its cuDNN call itself (custom partitioning)
            return self_attention(q_BTHD, k_BSKD, v_BSKD, local, impl=impl, chunk=local_chunk)
        # Pallas is opaque to GSPMD: each device runs the kernel on its own rows (sharding.per_shard). A traced
        # ``local`` (Llama 4's per-layer chunk flag in the layer scan) travels as a replicated operand.
        hq, hk = _kernel_head_axes(q_BTHD.shape[2], k_BSKD.shape[2])
        args, axes = (q_BTHD, k_BSKD, v_BSKD), (("batch", None, hq, None), ("batch", None, hk, None),
                                                ("batch", None, hk, None))
        if isinstance(local, jax.Array):
            return per_shard(lambda q, k, v, loc: self_attention(q, k, v, loc, impl=impl, chunk=local_chunk),
                             (*args, local), (*axes, ()), [(0, 4)])
        return per_shard(lambda q, k, v: self_attention(q, k, v, local, impl=impl, chunk=local_chunk), args, axes,
                         [(0, 4)])
    B, T, H, Dh = q_BTHD.shape
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    q = q_BTHD.reshape(B, T, K, H // K, Dh)
    if T <= chunk and S <= chunk:
        return dense_attention(q, k_BSKD, v_BSKD, causal_mask(qpos_BT, kpos_BS, local)).reshape(B, T, H, Dh)
    loc = jnp.asarray(local, jnp.int32) if _has_local(local) else None
    o = _flash(q, k_BSKD, v_BSKD, qpos_BT, kpos_BS, loc, min(chunk, T), min(chunk, S))
    return o.reshape(B, T, H, Dh)


def cached_attention(q_BTHD, k_BTKD, v_BTKD, pos_BT, cache, cfg: ModelConfig, local=0):
    """Attention over one layer's KV cache ``{"k", "v"}: [B, K, S, Dh]``: the new keys and values are written at
    slot = position first (in place), then the queries attend over every slot <= their position.
    Returns (output [B, T, H, Dh], the layer's updated cache).

    A single query per row (decode) takes one dense softmax over the slots in the cache's own layout, or with
    ``attention_impl="pallas"`` the library Pallas decode kernel (:func:`scalerl_jax.kernels.attention.pallas_decode`);
    longer inputs (prefill) go through the reference :func:`attention` whatever ``attention_impl`` says (keys are
    cache slots there, not the query rows the kernels assume). An implementation this backend cannot run is
    refused here too (:func:`scalerl_jax.kernels.attention.check_impl`)."""
    interpret = None
    if cfg.attention_impl != "reference":
        from scalerl_jax.kernels.attention import check_impl

        interpret = check_impl(cfg.attention_impl)
    B, T, H, Dh = q_BTHD.shape
    K = k_BTKD.shape[2]
    dt = dtype(cfg.dtype)
    b_idx = jnp.arange(B)[:, None, None]
    k_idx = jnp.arange(K)[None, :, None]
    p_idx = pos_BT[:, None, :]
    cache = {
        n: cache[n].at[b_idx, k_idx, p_idx].set(jnp.swapaxes(new, 1, 2).astype(cache[n].dtype))
        for n, new in (("k", k_BTKD), ("v", v_BTKD))
    }
    ck_BKSD, cv_BKSD = cache["k"].astype(dt), cache["v"].astype(dt)
    S = ck_BKSD.shape[2]
    slots_BS = jnp.broadcast_to(jnp.arange(S), (B, S))
    if T == 1 and cfg.attention_impl == "pallas":
        from scalerl_jax.kernels.attention import pallas_decode

        o = pallas_decode(q_BTHD.reshape(B, K, H // K, Dh), ck_BKSD, cv_BKSD, pos_BT[:, 0], local,
                          chunk=cfg.local_attn_chunk, interpret=interpret)
        return o.reshape(B, 1, H, Dh), cache
    if T == 1:
        q_BKGD = q_BTHD.reshape(B, K, H // K, Dh)
        s = jnp.einsum("bkgd,bksd->bkgs", q_BKGD, ck_BKSD, preferred_element_type=jnp.float32) / math.sqrt(Dh)
        s = jnp.where(causal_mask(pos_BT, slots_BS, local)[:, None], s, jnp.finfo(jnp.float32).min)
        p = jax.nn.softmax(s, axis=-1).astype(dt)
        o = jnp.einsum("bkgs,bksd->bkgd", p, cv_BKSD).reshape(B, 1, H, Dh)
        return o, cache
    k_BSKD, v_BSKD = jnp.swapaxes(ck_BKSD, 1, 2), jnp.swapaxes(cv_BKSD, 1, 2)
    return attention(q_BTHD, k_BSKD, v_BSKD, pos_BT, slots_BS, max(cfg.attn_chunk, T), local), cache


# ---- the two halves of a decoder layer ---------------------------------------------------------------


def project_qkv(x_BTD, lp, cfg: ModelConfig):
    """q [B, T, H, Dh], k and v [B, T, K, Dh] projected from ``rms_norm(x)`` (with Qwen2's biases and Qwen3's
    per-head norms), before positions are applied."""
    dt = dtype(cfg.dtype)
    h = rms_norm(x_BTD, lp["attn_norm"], cfg.rms_eps)
    q = proj(h, lp["wq"].astype(dt))
    k = proj(h, lp["wk"].astype(dt))
    v = proj(h, lp["wv"].astype(dt))
    if cfg.qkv_bias:  # Qwen2
        q, k, v = (a + lp[b].astype(dt)[None, None] for a, b in ((q, "bq"), (k, "bk"), (v, "bv")))
    if cfg.head_qk_norm:  # Qwen3: each head of q and k RMS-normed (gain [Dh]) before RoPE
        q, k = rms_norm(q, lp["q_norm"], cfg.rms_eps), rms_norm(k, lp["k_norm"], cfg.rms_eps)
    return q, k, v


def attention_block(x_BTD, lp, pos_BT, position, cfg: ModelConfig, cache=None, local=0):
    """Pre-norm attention with its residual: ``x + wo(attn(q, k, v))`` with q, k, v projected from
    ``rms_norm(x)`` and ``(q, k) = position(q, k)`` (RoPE, or what a NoPE layer does instead).

    ``lp``: attn_norm, wq, wk, wv, wo (and Qwen2's biases bq, bk, bv, Qwen3's per-head gains q_norm, k_norm);
    ``cache``: this layer's KV cache ``{"k", "v"}: [B, K, S, Dh]`` to write into and attend over (None: plain
    causal attention); ``local``: Llama 4's chunked attention. Returns (x, the updated cache or None)."""
    dt = dtype(cfg.dtype)
    with jax.named_scope("attention"):
        q, k, v = project_qkv(x_BTD, lp, cfg)
        q, k = position(q, k)
        q = constrain(q, ("batch", "seq", "q_heads", "head_dim"))
        if cache is None:
            o = attention(q, k, v, pos_BT, pos_BT, cfg.attn_chunk, local, cfg.attention_impl, cfg.local_attn_chunk)
        else:
            o, cache = cached_attention(q, k, v, pos_BT, cache, cfg, local)
        x_BTD = x_BTD + proj(o, lp["wo"].astype(dt), n_in=2)
    return constrain(x_BTD, ("batch", "seq", "act_embed")), cache


def ffn_block(x_BTD, norm_D, fp, cfg: ModelConfig):
    """Pre-norm dense SwiGLU with its residual (``fp``: w_gate, w_up, w_down)."""
    h = rms_norm(x_BTD, norm_D, cfg.rms_eps)
    y = swiglu(h, fp["w_gate"], fp["w_up"], fp["w_down"], dtype(cfg.dtype), ("batch", "seq", "mlp"))
    return constrain(x_BTD + y, ("batch", "seq", "act_embed"))


# ---- rematerialisation -----------------------------------------------------------------------------

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
