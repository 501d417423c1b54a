"""Causal GQA attention through library kernels: cuDNN flash attention and JAX's Pallas GPU ops.

``ModelConfig.attention_impl`` picks the implementation; the pure-JAX reference is
:func:`scalerl_jax.models.layers.attention` (dense for short inputs, our own flash-style custom VJP for long
ones), which ``"reference"`` keeps. Nothing here is a hand-written kernel: both backends exist in libraries, and
this module only adapts our layout and masks to them.

What is computed (B batch, T time, H query heads, K kv heads, G = H / K, Dh head dim): query t attends to key
s iff s <= t and, when Llama-4 chunked local attention is on for the layer (``local``), both lie in the same
``chunk``-sized block of positions. Positions are the row indices 0..T-1: the training forward pass, where the
model sees whole sequences from position 0. The KV-cached paths are below.

* ``"pallas"`` (training): ``jax.experimental.pallas.ops.gpu.attention.mha``, a flash-attention forward and
  backward in Pallas (Triton on GPU). It has no GQA, so the K kv heads are repeated G times before the call
  (its gradient sums them back); it masks causally by index and by ``segment_ids`` equality, and Llama-4's
  local chunks are exactly ``segment_id = position // chunk``. The sequence is padded to a multiple of the
  block size: padded keys come after every real query and are causally invisible to it, padded queries are
  sliced off. A traced per-layer ``local`` flag (the Scout layer scan) selects the segment ids, not the kernel.
* ``"cudnn"`` (training): ``jax.nn.dot_product_attention(..., implementation="cudnn", is_causal=True)``, with
  native GQA. Local chunks fold into the batch: the (padded) sequence is cut into ``chunk``-long pieces that
  each attend causally within themselves, which is the block-diagonal causal mask, with no [T, T] mask array.
  A traced ``local`` flag chooses between the folded and the plain call with ``lax.cond`` (one runs). cuDNN's
  flash attention takes float16 / bfloat16 only: float32 inputs are refused.
* Cached decode (one query per row over a KV cache ``[B, K, S, Dh]``): ``"pallas"`` uses the library decode
  kernel ``decode_attention.mqa`` over the (B x K) rows of the cache in its own layout (no copy when S is a
  multiple of 16 x its split count), with ``start_idx`` = the start of the query's local chunk (0 when global)
  and ``kv_seq_len`` = position + 1. ``"cudnn"`` decodes with the reference dense softmax: the cuDNN call wants
  [B, S, K, Dh] and would transpose the whole cache every step. Prefill over a cache (T > 1, keys are cache
  slots, not the query rows) uses the reference for every implementation.

Where they run: ``"pallas"`` interprets on CPU (exact and slow: for tests) and compiles with Triton on GPU;
``"cudnn"`` runs on CUDA GPUs only. Any other combination raises ``ValueError`` naming
``ModelConfig.attention_impl`` and the backend; nothing falls back to the reference silently. ``pallas_call`` is
opaque to GSPMD, so ``models.layers.attention`` runs the training kernel inside ``shard_map``
(``sharding.per_shard``: batch rows, and heads when the mesh splits query and kv heads alike); JAX partitions its
cuDNN call itself. The decode kernel runs in the embedded engine, which has no mesh.
On one H200 (docs/results/gpu_check.md) the compiled Pallas kernels and cuDNN passed their tests and ran a
2-layer 1B-shaped value + grad at 4k tokens 1.41x (Pallas) and 1.50x (cuDNN) faster than the reference. On CPU the
Pallas kernels run in interpret mode, the cuDNN wrapper's folding and GQA layout with ``implementation="xla"`` in
its place (``library_attention``), and the tests lower the compiled kernels for CUDA (no GPU needed).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

IMPLS = ("reference", "cudnn", "pallas")
_GPU = ("gpu", "cuda")


def check_impl(impl: str, *, interpret: bool | None = None) -> bool | None:
    """Refuse an ``attention_impl`` this process cannot run; return whether Pallas kernels are interpreted
    (None for implementations without Pallas). ``interpret=None``: interpret on CPU, compile on GPU."""
    if impl not in IMPLS:
        raise ValueError(f"ModelConfig.attention_impl must be one of {IMPLS}, got {impl!r}")
    backend = jax.default_backend()
    if impl == "cudnn":
        if backend not in _GPU:
            raise ValueError(f"ModelConfig.attention_impl='cudnn' needs a CUDA GPU, but the JAX backend is "
                             f"{backend!r}; use attention_impl='reference' (or 'pallas', interpreted on CPU)")
        return None
    if impl == "reference":
        return None
    if interpret is None:
        if backend == "cpu":
            return True
        if backend in _GPU:
            return False
        raise ValueError(f"ModelConfig.attention_impl='pallas' has no compiled kernel for the JAX backend "
                         f"{backend!r} (the library ops target Triton on GPUs); use attention_impl='reference'")
    if not interpret and backend not in _GPU:
        raise ValueError(f"ModelConfig.attention_impl='pallas' cannot compile for the JAX backend {backend!r}; "
                         "only interpret mode runs there")
    return bool(interpret)


def _local_parts(local, chunk: int | None):
    """(whether local attention may be on, static chunk size): ``local`` is an int (the chunk, 0 = off) or a
    traced int32 scalar that is 0 or ``chunk``."""
    if isinstance(local, (int, np.integer)):
        return (int(local) > 0), int(local)
    if not chunk:
        raise ValueError("a traced `local` flag needs the static chunk size (ModelConfig.local_attn_chunk)")
    return jnp.asarray(local) > 0, int(chunk)


def _pad_time(x, total: int):
    pad = total - x.shape[1]
    return x if pad == 0 else jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))


# ---- "pallas": jax.experimental.pallas.ops.gpu.attention.mha --------------------------------------------


def pallas_attention(q_BTHD, k_BTKD, v_BTKD, local=0, *, chunk: int | None = None, interpret: bool = True,
                     block: int = 128, block_bwd: int = 32) -> jax.Array:
    """Causal GQA attention with optional Llama-4 local chunks through the library Pallas flash attention.

    ``block`` / ``block_bwd``: forward / backward tile lengths (powers of two >= 16), clamped to the sequence;
    the sequence is padded to a multiple of both. Returns [B, T, H, Dh] in the input dtype."""
    from jax.experimental.pallas.ops.gpu import attention as pl_attention

    B, T, H, Dh = q_BTHD.shape
    K = k_BTKD.shape[2]
    for name, b in (("block", block), ("block_bwd", block_bwd)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"pallas_attention: {name} must be a power of two >= 16, got {b}")
    p2 = max(16, 1 << (T - 1).bit_length())
    bf, bb = min(block, p2), min(block_bwd, p2)
    Tp = -(-T // max(bf, bb)) * max(bf, bb)
    on, c = _local_parts(local, chunk)
    pos = jnp.arange(Tp, dtype=jnp.int32)
    if on is False:
        seg = None
    else:
        seg = jnp.broadcast_to(jnp.where(on, pos // max(c, 1), 0), (B, Tp)).astype(jnp.int32)
    q = _pad_time(q_BTHD, Tp)
    k = jnp.repeat(_pad_time(k_BTKD, Tp), H // K, axis=2)  # GQA: kv head j serves query heads j*G .. j*G+G-1
    v = jnp.repeat(_pad_time(v_BTKD, Tp), H // K, axis=2)
    sizes = pl_attention.BlockSizes(block_q=bf, block_k=bf, block_q_dkv=bb, block_kv_dkv=bb, block_q_dq=bb,
                                    block_kv_dq=bb)
    o = pl_attention.mha(q, k, v, seg, sm_scale=1.0 / math.sqrt(Dh), causal=True, block_sizes=sizes,
                         interpret=interpret)
    return o[:, :T]


def pallas_decode(q_BKGD, k_BKSD, v_BKSD, pos_B, local=0, *, chunk: int | None = None,
                  interpret: bool = True) -> jax.Array:
    """One query per row over a KV cache in its own layout through the library Pallas decode kernel: query
    heads G of kv head k attend to slots [start, pos] with start the first slot of the query's local chunk (0
    when global). Returns [B, K, G, Dh]."""
    from jax.experimental.pallas.ops.gpu import decode_attention as pl_decode

    B, K, G, Dh = q_BKGD.shape
    S = k_BKSD.shape[2]
    splits = max(1, min(16, S // 128))
    Sp = -(-S // (16 * splits)) * (16 * splits)  # every split a multiple of 16 slots (the kernel's minimum)
    if Sp != S:
        widths = [(0, 0), (0, 0), (0, Sp - S), (0, 0)]
        k_BKSD, v_BKSD = jnp.pad(k_BKSD, widths), jnp.pad(v_BKSD, widths)
    split = Sp // splits
    block_k = next(b for b in (128, 64, 32, 16) if split % b == 0)
    on, c = _local_parts(local, chunk)
    pos = pos_B.astype(jnp.int32)
    start = jnp.where(on, (pos // max(c, 1)) * max(c, 1), 0) if on is not False else jnp.zeros_like(pos)
    rows = B * K
    o = pl_decode.mqa(q_BKGD.reshape(rows, G, Dh), k_BKSD.reshape(rows, Sp, Dh), v_BKSD.reshape(rows, Sp, Dh),
                      jnp.repeat(start, K), jnp.repeat(pos + 1, K), sm_scale=1.0 / math.sqrt(Dh), block_k=block_k,
                      k_splits=splits, interpret=interpret)
    return o.reshape(B, K, G, Dh)


# ---- "cudnn": jax.nn.dot_product_attention ----------------------------------------------------------------


def library_attention(q_BTHD, k_BTKD, v_BTKD, local=0, *, chunk: int | None = None,
                      implementation: str = "cudnn") -> jax.Array:
    """Causal GQA attention with optional local chunks through ``jax.nn.dot_product_attention`` (``is_causal``;
    local chunks folded into the batch). ``implementation="cudnn"`` is what ``attention_impl="cudnn"`` runs;
    ``"xla"`` is the same call on any backend (how the folding is tested on CPU)."""
    B, T, H, Dh = q_BTHD.shape
    on, c = _local_parts(local, chunk)

    def plain(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)

    def folded(q, k, v):
        n = -(-T // c)

        def fold(x):
            x = _pad_time(x, n * c)
            return x.reshape(B * n, c, *x.shape[2:])

        o = plain(fold(q), fold(k), fold(v))
        return o.reshape(B, n * c, H, Dh)[:, :T]

    if on is False or c >= T:  # a chunk as long as the sequence restricts nothing
        return plain(q_BTHD, k_BTKD, v_BTKD)
    if on is True:
        return folded(q_BTHD, k_BTKD, v_BTKD)
    return jax.lax.cond(on, folded, plain, q_BTHD, k_BTKD, v_BTKD)


def cudnn_attention(q_BTHD, k_BTKD, v_BTKD, local=0, *, chunk: int | None = None) -> jax.Array:
    """:func:`library_attention` on cuDNN; refuses inputs cuDNN's flash attention does not take."""
    if q_BTHD.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(f"ModelConfig.attention_impl='cudnn' takes bfloat16 or float16 activations, got "
                         f"{q_BTHD.dtype} (ModelConfig.dtype='float32'); use attention_impl='reference' or 'pallas'")
    return library_attention(q_BTHD, k_BTKD, v_BTKD, local, chunk=chunk, implementation="cudnn")


# ---- the dispatch ------------------------------------------------------------------------------------------


def self_attention(q_BTHD, k_BTKD, v_BTKD, local=0, *, impl: str, chunk: int | None = None,
                   interpret: bool | None = None) -> jax.Array:
    """Training attention (positions 0..T-1) by ``impl`` = ``ModelConfig.attention_impl`` other than
    ``"reference"`` (the caller keeps the reference itself); refuses what this backend cannot run."""
    interp = check_impl(impl, interpret=interpret)
    if impl == "pallas":
        return pallas_attention(q_BTHD, k_BTKD, v_BTKD, local, chunk=chunk, interpret=interp)
    if impl == "cudnn":
        return cudnn_attention(q_BTHD, k_BTKD, v_BTKD, local, chunk=chunk)
    raise ValueError(f"self_attention: attention_impl={impl!r} is the caller's reference path, not a kernel")
