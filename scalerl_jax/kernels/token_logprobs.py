"""Fused LM-head token log-probs and entropies: a Pallas kernel that never holds the [N, V] logits.

For hidden states h_n (D), head weight W (D x V), targets y_n and temperature tau (N = B * T rows):

    z_n       = h_n @ W / tau                                   (float32 whatever the input dtype)
    logp_n    = z_n[y_n] - lse_n,          lse_n = logsumexp(z_n)
    entropy_n = lse_n - mu_n,              mu_n  = sum_v softmax(z_n)_v * z_n,v

Forward (grid over row blocks of ``block_rows``): each program walks the vocabulary in tiles of
``block_vocab`` columns, builds the [block_rows, block_vocab] logit tile from ``block_d``-wide slices of h and
W (float32 products at HIGHEST precision, so bf16 inputs get the FP32 head), and keeps online-softmax
statistics per row: the running max m, l = sum exp(z - m), s = sum exp(z - m) * z, and the picked target
logit. At the end lse = m + log l and mu = s / l. Only one logit tile per program is ever live.

Backward (``jax.custom_vjp``): with p = softmax(z) and incoming cotangents g_logp, g_ent,

    d logp / dz_v    = [v == y] - p_v
    d entropy / dz_v = -p_v * (z_v - mu)            (d lse = p; d mu = p_v (1 + z_v - mu))
    dz_v             = (g_logp * ([v == y] - p_v) - g_ent * p_v * (z_v - mu)) / tau

and dh = dz @ W^T, dW = h^T @ dz. Two kernels recompute the logit tiles from the saved (h, W, lse, mu)
instead of storing them: one over row blocks accumulates its rows of dh across vocab tiles, one over vocab
tiles accumulates its columns of dW across row blocks. Each program owns its output block, so the read-modify-
write accumulation in the output ref needs no atomics and no grid axis that runs in order (the Triton backend
runs every grid point in parallel). The price is recomputing the logits twice (5 head matmuls in all against
3 for a kernel that stored them), the usual trade of fused cross-entropy kernels.

Ragged shapes are padded in the wrapper: rows to a multiple of ``block_rows`` (padded rows get zero cotangent
and are sliced off), the vocabulary to a multiple of ``block_vocab`` (padded columns are masked to a large
negative logit inside the kernel, so they carry zero probability and zero gradient), D to a multiple of
``block_d`` (zero columns add nothing to the products). Llama-3's V = 128256 and D = 4096 need no padding at the
default tiles, so W is not copied.

Where it runs: ``interpret=None`` interprets the kernel on CPU (slow, exact: the correctness path the tests
use) and compiles it with the Triton backend on GPU; other backends are refused with a message rather than
silently falling back. Refs are indexed once per access (``w_ref[d, cols]``, never a view of a view: the Triton
lowering refuses ``ref.at[...][...]``). On one H200 (docs/results/gpu_check.md) the compiled kernel passed its
tests and held 0.64x the reference's temporary memory, but ran about 150x slower than the reference: its float32
products run at HIGHEST precision (no tensor cores) in untuned tiles (powers of two >= 16, as Triton's dot
requires). It is a memory option, not a speed one, and no preset uses it. ``pallas_call`` is opaque to
GSPMD (under a sharded ``jit`` it would see whole, gathered operands), so the train step's dispatch
(``losses.logprobs.head_logprobs``) runs it inside ``shard_map`` over the batch rows
(``sharding.per_shard``; tests/test_sharded_kernels.py). The pure-JAX reference is
:func:`scalerl_jax.losses.logprobs.token_logprobs` (chunked) and ``token_logprobs_naive`` (full logits).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

_F32 = jnp.float32
# A finite "minus infinity" for padded vocabulary columns: exp() of it underflows to exactly 0 and, unlike -inf,
# it never produces inf - inf = NaN in the running-max update or 0 * inf = NaN in the gradient.
_MASKED = -0.7 * float(np.finfo(np.float32).max)
_HIGHEST = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)  # IEEE float32 on Triton, not TF32


class _Tiles(NamedTuple):
    """Static kernel geometry (a hashable ``nondiff`` argument of the custom VJP)."""

    n_vocab: int  # true V; columns at or beyond it are padding
    rows: int  # block of flattened B*T rows per program
    vocab: int  # vocabulary tile
    d: int  # slice of the model dimension per partial product
    temperature: float
    interpret: bool


def resolve_interpret(interpret: bool | None) -> bool:
    """Whether to interpret: ``None`` means interpret on CPU and compile on GPU. Raises ``ValueError`` for what
    cannot work (no compiled kernel for the backend) instead of failing deep in lowering."""
    backend = jax.default_backend()
    if interpret is None:
        if backend == "cpu":
            return True
        if backend in ("gpu", "cuda", "rocm"):
            return False
        raise ValueError(f"token_logprobs: no compiled Pallas kernel for backend {backend!r} (this kernel targets "
                         "the GPU Triton backend); pass interpret=True to run it in Pallas interpret mode")
    if not interpret and backend == "cpu":
        raise ValueError("token_logprobs: Pallas kernels cannot be compiled for the CPU backend; use interpret=True "
                         "(or interpret=None, which interprets on CPU)")
    return bool(interpret)


def _tile(block: int, size: int, name: str) -> int:
    """Block size clamped to the (power-of-two rounded) dimension, never below Triton's dot minimum of 16."""
    if block < 16 or block & (block - 1):
        raise ValueError(f"token_logprobs: {name} must be a power of two >= 16, got {block}")
    return min(block, max(16, pl.next_power_of_2(size)))


def _logit_tile(h_ref, w_ref, t: _Tiles, rows=slice(None), cols=slice(None)) -> jax.Array:
    """float32 ``h[rows] @ w[:, cols] / temperature``, D in slices. ``rows`` / ``cols`` are ``pl.ds`` windows (or
    whole axes) indexed together with the D slice in one indexing of each ref: Pallas' Triton lowering refuses a
    ref view of a ref view (``ref.at[...][...]``: "No support for multiple indexers")."""
    n_d = h_ref.shape[1] // t.d
    n_rows = h_ref.shape[0] if isinstance(rows, slice) else rows.size
    n_cols = w_ref.shape[1] if isinstance(cols, slice) else cols.size

    def body(k, acc):
        d = pl.ds(pl.multiple_of(k * t.d, t.d), t.d)
        hk = h_ref[rows, d].astype(_F32)
        wk = w_ref[d, cols].astype(_F32)
        return acc + jax.lax.dot(hk, wk, precision=_HIGHEST, preferred_element_type=_F32)

    z = jax.lax.fori_loop(0, n_d, body, jnp.zeros((n_rows, n_cols), _F32))
    return z / t.temperature


def _masked_logits(z, col0, t: _Tiles):
    """Padded vocabulary columns of a logit tile set to a large negative value; also their validity mask."""
    cols = col0 + jax.lax.broadcasted_iota(jnp.int32, z.shape, 1)
    valid = cols < t.n_vocab
    return jnp.where(valid, z, _MASKED), cols, valid


def _fwd_kernel(h_ref, w_ref, y_ref, logp_ref, ent_ref, lse_ref, *, t: _Tiles):
    y = y_ref[...]
    n_rows = h_ref.shape[0]

    def body(j, carry):
        m, l, s, picked = carry
        col0 = pl.multiple_of(j * t.vocab, t.vocab)
        z = _logit_tile(h_ref, w_ref, t, cols=pl.ds(col0, t.vocab))
        z, cols, valid = _masked_logits(z, col0, t)
        m_new = jnp.maximum(m, jnp.max(z, axis=1))
        scale = jnp.exp(m - m_new)  # rescales the sums kept relative to the old max
        e = jnp.exp(z - m_new[:, None])
        l = scale * l + jnp.sum(e, axis=1)
        s = scale * s + jnp.sum(jnp.where(valid, e * z, 0.0), axis=1)
        picked = picked + jnp.sum(jnp.where(cols == y[:, None], z, 0.0), axis=1)
        return m_new, l, s, picked

    zeros = jnp.zeros((n_rows,), _F32)
    init = (jnp.full((n_rows,), -jnp.inf, _F32), zeros, zeros, zeros)
    m, l, s, picked = jax.lax.fori_loop(0, w_ref.shape[1] // t.vocab, body, init)
    lse = m + jnp.log(l)
    logp_ref[...] = picked - lse
    ent_ref[...] = lse - s / l
    lse_ref[...] = lse


def _dlogits(z, cols, valid, y, lse, mu, g_logp, g_ent, t: _Tiles):
    """Cotangent of the pre-temperature logit tile (module docstring), zero on padded columns."""
    p = jnp.exp(z - lse[:, None])
    onehot = (cols == y[:, None]).astype(_F32)
    dz = g_logp[:, None] * (onehot - p) - g_ent[:, None] * p * (z - mu[:, None])
    return jnp.where(valid, dz, 0.0) / t.temperature


def _dh_kernel(h_ref, w_ref, y_ref, lse_ref, mu_ref, gl_ref, ge_ref, dh_ref, *, t: _Tiles):
    n_d = h_ref.shape[1] // t.d
    rows = (y_ref[...], lse_ref[...], mu_ref[...], gl_ref[...], ge_ref[...])

    def zero(k, _):
        dh_ref[:, pl.ds(pl.multiple_of(k * t.d, t.d), t.d)] = jnp.zeros((h_ref.shape[0], t.d), _F32)

    jax.lax.fori_loop(0, n_d, zero, None)

    def vocab_tile(j, _):
        col0 = pl.multiple_of(j * t.vocab, t.vocab)
        c = pl.ds(col0, t.vocab)
        z, cols, valid = _masked_logits(_logit_tile(h_ref, w_ref, t, cols=c), col0, t)
        dz = _dlogits(z, cols, valid, *rows, t)

        def accumulate(k, _):
            d = pl.ds(pl.multiple_of(k * t.d, t.d), t.d)
            wk = w_ref[d, c].astype(_F32)
            dh_ref[:, d] += jax.lax.dot_general(dz, wk, (((1,), (1,)), ((), ())), precision=_HIGHEST,
                                                preferred_element_type=_F32)

        jax.lax.fori_loop(0, n_d, accumulate, None)

    jax.lax.fori_loop(0, w_ref.shape[1] // t.vocab, vocab_tile, None)


def _dw_kernel(h_ref, w_ref, y_ref, lse_ref, mu_ref, gl_ref, ge_ref, dw_ref, *, t: _Tiles):
    n_d = h_ref.shape[1] // t.d
    col0 = pl.program_id(0) * t.vocab

    def zero(k, _):
        dw_ref[pl.ds(pl.multiple_of(k * t.d, t.d), t.d), :] = jnp.zeros((t.d, t.vocab), _F32)

    jax.lax.fori_loop(0, n_d, zero, None)

    def row_block(i, _):
        r = pl.ds(pl.multiple_of(i * t.rows, t.rows), t.rows)
        z, cols, valid = _masked_logits(_logit_tile(h_ref, w_ref, t, rows=r), col0, t)
        dz = _dlogits(z, cols, valid, y_ref[r], lse_ref[r], mu_ref[r], gl_ref[r], ge_ref[r], t)

        def accumulate(k, _):
            d = pl.ds(pl.multiple_of(k * t.d, t.d), t.d)
            hk = h_ref[r, d].astype(_F32)
            dw_ref[d, :] += jax.lax.dot_general(hk, dz, (((0,), (0,)), ((), ())), precision=_HIGHEST,
                                                preferred_element_type=_F32)

        jax.lax.fori_loop(0, n_d, accumulate, None)

    jax.lax.fori_loop(0, h_ref.shape[0] // t.rows, row_block, None)


def _call(kernel, grid, in_specs, out_specs, out_shape, t: _Tiles, name: str):
    params = {}
    if not t.interpret:
        from jax.experimental.pallas import triton as pl_triton

        params["compiler_params"] = pl_triton.CompilerParams(num_warps=4, num_stages=2)
    return pl.pallas_call(functools.partial(kernel, t=t), grid=grid, in_specs=in_specs, out_specs=out_specs,
                          out_shape=out_shape, interpret=t.interpret, name=name, **params)


def _forward(h_ND, w_DV, y_N, t: _Tiles):
    N, D = h_ND.shape
    V = w_DV.shape[1]
    row = pl.BlockSpec((t.rows,), lambda i: (i,))
    vec = jax.ShapeDtypeStruct((N,), _F32)
    return _call(
        _fwd_kernel, (N // t.rows,),
        [pl.BlockSpec((t.rows, D), lambda i: (i, 0)), pl.BlockSpec((D, V), lambda i: (0, 0)), row],
        [row, row, row], [vec, vec, vec], t, "token_logprobs_fwd",
    )(h_ND, w_DV, y_N)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(h_ND, w_DV, y_N, t: _Tiles):
    logp, ent, _ = _forward(h_ND, w_DV, y_N, t)
    return logp, ent


def _fused_fwd(h_ND, w_DV, y_N, t: _Tiles):
    logp, ent, lse = _forward(h_ND, w_DV, y_N, t)
    return (logp, ent), (h_ND, w_DV, y_N, lse, lse - ent)


def _fused_bwd(t: _Tiles, res, cot):
    h_ND, w_DV, y_N, lse, mu = res
    g_logp, g_ent = (c.astype(_F32) for c in cot)
    N, D = h_ND.shape
    V = w_DV.shape[1]
    per_row = (y_N, lse, mu, g_logp, g_ent)
    row_blk = pl.BlockSpec((t.rows,), lambda i: (i,))
    dh = _call(
        _dh_kernel, (N // t.rows,),
        [pl.BlockSpec((t.rows, D), lambda i: (i, 0)), pl.BlockSpec((D, V), lambda i: (0, 0))] + [row_blk] * 5,
        pl.BlockSpec((t.rows, D), lambda i: (i, 0)), jax.ShapeDtypeStruct((N, D), _F32), t, "token_logprobs_dh",
    )(h_ND, w_DV, *per_row)
    all_rows = pl.BlockSpec((N,), lambda j: (0,))
    dw = _call(
        _dw_kernel, (V // t.vocab,),
        [pl.BlockSpec((N, D), lambda j: (0, 0)), pl.BlockSpec((D, t.vocab), lambda j: (0, j))] + [all_rows] * 5,
        pl.BlockSpec((D, t.vocab), lambda j: (0, j)), jax.ShapeDtypeStruct((D, V), _F32), t, "token_logprobs_dw",
    )(h_ND, w_DV, *per_row)
    y_cot = np.zeros(y_N.shape, dtype=jax.dtypes.float0)
    return dh.astype(h_ND.dtype), dw.astype(w_DV.dtype), y_cot


_fused.defvjp(_fused_fwd, _fused_bwd)


def _pad_to(x: jax.Array, axis: int, multiple: int) -> jax.Array:
    extra = -x.shape[axis] % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def token_logprobs(
    h_BTD: jax.Array,
    w_DV: jax.Array,
    targets_BT: jax.Array,
    *,
    temperature: float = 1.0,
    interpret: bool | None = None,
    block_rows: int = 64,
    block_vocab: int = 128,
    block_d: int = 64,
) -> tuple[jax.Array, jax.Array]:
    """Fused ``(logp_BT, entropy_BT)`` of ``targets_BT`` under ``softmax(h_BTD @ w_DV / temperature)``.

    The head math is float32 whatever the input dtype (ScaleRL's FP32 logits); no [B, T, V] logits exist in the
    forward or the backward pass (module docstring). Equal, up to float32 summation order, to
    :func:`scalerl_jax.losses.logprobs.token_logprobs` with ``head_dtype="float32"``.

    Args:
      h_BTD: [B, T, D] final-norm hidden states (float32 or bfloat16).
      w_DV: [D, V] LM-head weight (float32 or bfloat16).
      targets_BT: [B, T] int token ids in [0, V) (padding positions included: any valid id).
      temperature: Python number; logits are divided by it, as in the generator.
      interpret: True runs the Pallas interpreter, False compiles (GPU only); None: interpret on CPU, compile
        on GPU, refuse elsewhere.
      block_rows, block_vocab, block_d: tile sizes (powers of two >= 16), clamped to the padded shape.

    Returns:
      float32 ``logp_BT`` and ``entropy_BT``; differentiable with respect to ``h_BTD`` and ``w_DV`` (gradients
      in their dtypes).
    """
    B, T, D = h_BTD.shape
    D2, V = w_DV.shape
    if D2 != D or targets_BT.shape != (B, T):
        raise ValueError(f"token_logprobs: shapes h {h_BTD.shape}, w {w_DV.shape}, targets {targets_BT.shape} "
                         "do not fit [B, T, D], [D, V], [B, T]")
    N = B * T
    t = _Tiles(n_vocab=V, rows=_tile(block_rows, N, "block_rows"), vocab=_tile(block_vocab, V, "block_vocab"),
               d=_tile(block_d, D, "block_d"), temperature=float(temperature), interpret=resolve_interpret(interpret))
    h = _pad_to(_pad_to(h_BTD.reshape(N, D), 0, t.rows), 1, t.d)
    w = _pad_to(_pad_to(w_DV, 0, t.d), 1, t.vocab)
    y = _pad_to(targets_BT.reshape(N).astype(jnp.int32), 0, t.rows)
    logp, ent = _fused(h, w, y, t)
    return logp[:N].reshape(B, T), ent[:N].reshape(B, T)
