"""The FP32 LM head's matmul, at the precision ``ModelConfig.head_matmul_impl`` names.

ScaleRL's FP32 head is about the precision of the logits and log-probs that enter the importance ratio, not about
which hardware units compute them. An IEEE float32 matmul (``"reference"``: ``Precision.HIGHEST``) cannot use a
GPU's tensor cores; the head of a 1B model is about a fifth of the step's FLOPs, and at float32's rate most of its
time. The other choices compute the same float32 logits from bfloat16 products, each exact in float32 (8 x 8
significant bits), accumulated in float32, which tensor cores do at bf16 speed (bf16's unit roundoff: 2^-8):

* ``"bf16x3"``: each operand split into two bfloat16 terms, ``x = hi + lo`` (``hi = bf16(x)``, ``lo = bf16(x -
  hi)``), and the three products ``hi.hi + hi.lo + lo.hi``; dropped: ``lo.lo`` and the split's residual, each
  <= 2^-16 |x||y| per product. 3 bf16 matmuls.
* ``"bf16x6"``: three terms per operand and the six products whose term indices sum to <= 2 (the split keeps ~24 of
  float32's bits); about float32's own accuracy. 6 bf16 matmuls.
* ``"bf16"``: one bf16 term per operand (the inputs rounded to bfloat16: <= 2^-8 relative each), accumulated in
  float32. 1 bf16 matmul. Not the ``head_dtype="bfloat16"`` ablation: the logits stay float32.

On a CPU every choice computes with float32 arithmetic on the bf16 terms, so its numbers are what a GPU's tensor
cores give up to the order of the float32 accumulation (``benchmarks/fp32_head.py`` measures each against a float64
reference: docs/results/fp32_head.md). The choice applies to the trainer's log-probs and the generator's logits
alike. Gradients go through the same terms by JAX's rules for the casts and dots: each bf16 dot's cotangent is
rounded to bf16 (its primal's dtype), so the head's gradients in the bf16 options are about bf16-precise (2^-8
relative), like every other matmul of a bf16 network, while the logits that enter the importance ratio keep the
accuracy above.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: ModelConfig.head_matmul_impl choices -> bfloat16 terms per operand (0: IEEE float32, Precision.HIGHEST)
HEAD_MATMUL_TERMS = {"reference": 0, "bf16x3": 2, "bf16x6": 3, "bf16": 1}


def split_bf16(x: jax.Array, terms: int) -> list[jax.Array]:
    """``terms`` bfloat16 arrays whose float32 sum approximates ``x`` (float32), largest first."""
    x = x.astype(jnp.float32)
    out = []
    for _ in range(terms):
        t = x.astype(jnp.bfloat16)
        out.append(t)
        x = x - t.astype(jnp.float32)
    return out


def split_head(w: jax.Array, impl: str) -> tuple[jax.Array, ...]:
    """The head ``w`` [D, V] as ``impl`` multiplies it: float32 (reference) or its bf16 terms. A caller that runs the
    head over many blocks of positions (``losses.logprobs.token_logprobs``) splits it once, outside its loop."""
    if impl not in HEAD_MATMUL_TERMS:
        raise ValueError(f"head_matmul_impl must be one of {sorted(HEAD_MATMUL_TERMS)}, got {impl!r}")
    terms = HEAD_MATMUL_TERMS[impl]
    return (w.astype(jnp.float32),) if terms == 0 else tuple(split_bf16(w, terms))


def head_matmul(h: jax.Array, w: jax.Array | tuple[jax.Array, ...], impl: str = "reference") -> jax.Array:
    """float32 ``h [..., D] @ w [D, V]`` at the precision of ``impl`` (module docstring); ``w`` may come split
    already (:func:`split_head` with the same ``impl``)."""
    ws = w if isinstance(w, tuple) else split_head(w, impl)
    terms = HEAD_MATMUL_TERMS[impl]
    lead, v = h.shape[:-1], ws[0].shape[-1]
    h = h.reshape(-1, h.shape[-1])  # one 2-D matmul: its weight gradient needs no transposed copy on CPU (layers.proj)
    if terms == 0:
        out = jnp.dot(h.astype(jnp.float32), ws[0], precision=jax.lax.Precision.HIGHEST,
                      preferred_element_type=jnp.float32)
        return out.reshape(*lead, v)
    hs = split_bf16(h, terms)
    # the products with term indices i + j < terms, smallest first, so the float32 sum rounds the big ones last
    pairs = sorted(((i, j) for i in range(terms) for j in range(terms) if i + j < terms), key=lambda p: -(p[0] + p[1]))
    out = None
    for i, j in pairs:
        p = jnp.dot(hs[i], ws[j], preferred_element_type=jnp.float32)
        out = p if out is None else out + p
    return out.reshape(*lead, v)
