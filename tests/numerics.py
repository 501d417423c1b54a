"""Tolerances derived from float rounding, for tests that compare two computations of the same values (two
orderings of the same float32 work, or float32 work against a float64 reference).

A float result here is a chain of reductions (a matmul, a softmax's sum, a gradient's sum over positions). Summing
n terms in another order changes the sum by at most n eps s, where s bounds the terms' magnitudes; the rounding
errors of a sum carry random signs, so by about sqrt(n) eps s in practice (the bound these helpers use). A result
that passes through ``stages`` such reductions picks up one such change per stage (each relative to that stage's
scale, taken here as the result's own scale: the values compared are of the size of the terms they sum, or
smaller, so this overstates nothing small). Both computations may move, hence a factor 2 (against a float64
reference only one does: the bound is then conservative by 2).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["eps", "forward_atol", "reorder_atol"]


def eps(dtype=np.float32) -> float:
    """The machine epsilon of ``dtype`` (float32: 1.19e-7; bfloat16: 7.8e-3)."""
    try:
        return float(np.finfo(dtype).eps)
    except (TypeError, ValueError):  # bfloat16 (ml_dtypes) when NumPy does not know it by name
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).eps)


def reorder_atol(n: int, scale: float, *, stages: int = 1, dtype=np.float32) -> float:
    """Absolute tolerance between two computations of values of magnitude up to ``scale``, each through ``stages``
    reductions of at most ``n`` terms in ``dtype``: 2 stages sqrt(n) eps scale."""
    return 2.0 * stages * math.sqrt(n) * eps(dtype) * float(scale)


def forward_atol(cfg, scale: float) -> float:
    """Tolerance between two float32 computations of a model's logits (magnitude up to ``scale``), e.g. a
    KV-cached decode against the cache-free forward pass: 2 + 2 n_layers chained stages (each layer's attention and
    MLP, the final norm and the head), each reducing at most max(d_model, ffn_dim, expert_ffn_dim) terms. Every
    stage's input is RMS-normalised (entries of order 1), so the scale is at least 1 even where the outputs are
    smaller than the terms they sum."""
    n = max(cfg.d_model, cfg.ffn_dim, getattr(cfg, "expert_ffn_dim", 0) or 0)
    return reorder_atol(n, max(1.0, float(scale)), stages=2 + 2 * cfg.n_layers)
