"""Token log-probs and entropies through the LM head, chunked over the sequence.

For final-norm hidden states h_{b,t} (D), head weight W (D x V) and sampled targets y_{b,t}:

    z_{b,t}       = h_{b,t} @ W / temperature                          (logits, V)
    logp_{b,t}    = z_{b,t}[y_{b,t}] - logsumexp(z_{b,t})
    entropy_{b,t} = logsumexp(z_{b,t}) - sum_v softmax(z_{b,t})_v * z_{b,t,v}

``token_logprobs`` computes this ``chunk`` positions at a time under ``lax.map`` with each chunk wrapped in
``jax.checkpoint``, so neither the forward nor the backward pass ever holds more than one [B, chunk, V] block
of logits (plus its cotangent) instead of the full [B, T, V] tensor (16 GiB in float32 for B=4, T=8192,
V=128256). ``head_dtype="float32"`` casts h and W to float32 before the matmul (ScaleRL's FP32-logits fix);
``"bfloat16"`` runs the matmul in bf16 and rounds the logits to bf16 (the ablation), after which the softmax
statistics are taken in float32 in both modes. With the float32 head, ``head_matmul_impl`` picks how its matmul is
computed (``scalerl_jax.models.head_matmul``: IEEE float32, or float32 sums of exact bf16 products).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from scalerl_jax.models.head_matmul import head_matmul, split_head
from scalerl_jax.models.layers import dtype as _dtype

_head_dtype = functools.partial(_dtype, what="head_dtype")


def _logp_entropy(h_BxD: jax.Array, w_DV: jax.Array, tgt_Bx: jax.Array, temperature: float,
                  head_matmul_impl: str = "reference"):
    """Log-prob of ``tgt`` and entropy for a block of positions; ``h`` and ``w`` already in the head dtype (a float32
    head may come as :func:`split_head`'s terms)."""
    if h_BxD.dtype == jnp.float32:
        logits = head_matmul(h_BxD, w_DV, head_matmul_impl)
    else:
        logits = jnp.einsum("...d,dv->...v", h_BxD, w_DV, preferred_element_type=h_BxD.dtype)
    logits = logits.astype(jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tgt_Bx[..., None].astype(jnp.int32), axis=-1)[..., 0]
    probs = jnp.exp(logits - lse[..., None])
    entropy = lse - jnp.sum(probs * logits, axis=-1)
    return picked - lse, entropy


def token_logprobs(
    hidden_BTD: jax.Array,
    head_DV: jax.Array,
    targets_BT: jax.Array,
    *,
    chunk: int = 256,
    head_dtype: str = "float32",
    temperature: float = 1.0,
    head_matmul_impl: str = "reference",
) -> tuple[jax.Array, jax.Array]:
    """Chunked ``(logp_BT, entropy_BT)`` of ``targets_BT`` under ``softmax(hidden @ head / temperature)``.

    Args:
      hidden_BTD: [B, T, D] final-norm hidden states (any float dtype).
      head_DV: [D, V] LM-head weight (for tied embeddings pass ``embed.T``).
      targets_BT: [B, T] int token ids whose log-prob is wanted (the next tokens).
      chunk: positions per block; peak logits memory is ``B * chunk * V`` floats (x ~3 in the backward pass).
      head_dtype: "float32" (FP32 logits, the default) or "bfloat16" (the ablation).
      temperature: the sampling temperature; logits are divided by it, as in the generator.
      head_matmul_impl: the float32 head's matmul (``ModelConfig.head_matmul_impl``).

    Returns:
      float32 ``logp_BT`` and ``entropy_BT``. Differentiable with respect to ``hidden_BTD`` and ``head_DV``.
    """
    dtype = _head_dtype(head_dtype)
    B, T, D = hidden_BTD.shape
    c = max(1, min(int(chunk), T))
    n_chunks = -(-T // c)
    pad = n_chunks * c - T
    h = hidden_BTD.astype(dtype)
    w = head_DV.astype(dtype)
    tgt = targets_BT.astype(jnp.int32)
    if dtype == jnp.float32:  # split once here, not in every block of the loop below
        w = split_head(w, head_matmul_impl)
    if pad:
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        tgt = jnp.pad(tgt, ((0, 0), (0, pad)))
    h_NBcD = h.reshape(B, n_chunks, c, D).transpose(1, 0, 2, 3)
    tgt_NBc = tgt.reshape(B, n_chunks, c).transpose(1, 0, 2)

    # Checkpointing the block keeps only its inputs as residuals: the backward pass recomputes the block's
    # logits instead of storing n_chunks of them.
    block = jax.checkpoint(functools.partial(_logp_entropy, temperature=temperature,
                                             head_matmul_impl=head_matmul_impl), prevent_cse=False)
    logp_NBc, ent_NBc = jax.lax.map(lambda xs: block(xs[0], w, xs[1]), (h_NBcD, tgt_NBc))
    logp_BT = logp_NBc.transpose(1, 0, 2).reshape(B, n_chunks * c)[:, :T]
    ent_BT = ent_NBc.transpose(1, 0, 2).reshape(B, n_chunks * c)[:, :T]
    return logp_BT, ent_BT


def token_logprobs_naive(
    hidden_BTD: jax.Array,
    head_DV: jax.Array,
    targets_BT: jax.Array,
    *,
    head_dtype: str = "float32",
    temperature: float = 1.0,
    head_matmul_impl: str = "reference",
) -> tuple[jax.Array, jax.Array]:
    """Reference ``(logp_BT, entropy_BT)`` that materialises the full [B, T, V] logits (tests, benchmarks)."""
    dtype = _head_dtype(head_dtype)
    return _logp_entropy(hidden_BTD.astype(dtype), head_DV.astype(dtype), targets_BT, temperature, head_matmul_impl)
