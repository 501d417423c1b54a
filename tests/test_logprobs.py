"""Chunked FP32 token log-probs: equal to the naive computation (values, gradients), bounded memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.losses import token_logprobs, token_logprobs_naive
from tests.numerics import reorder_atol


def _logit_atol(h, w, temperature=1.0) -> float:
    """Log-probs and entropies pass through 2 float32 reductions, the D-term logits and the V-term log-sum-exp, of
    values up to the largest logit (tests/numerics.py)."""
    z = np.asarray(h, np.float64) @ np.asarray(w, np.float64) / temperature
    return reorder_atol(w.shape[-1], np.abs(z).max(), stages=2)


def _inputs(B=2, T=37, D=16, V=97, seed=0, dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    h = jax.random.normal(k1, (B, T, D), jnp.float32).astype(dtype)
    w = jax.random.normal(k2, (D, V), jnp.float32) * 0.5
    tgt = jax.random.randint(k3, (B, T), 0, V)
    return h, w, tgt


def test_matches_numpy_definition():
    h, w, tgt = _inputs()
    logp, ent = token_logprobs(h, w, tgt, chunk=8, temperature=0.7)
    z = np.asarray(h, np.float64) @ np.asarray(w, np.float64) / 0.7
    z -= z.max(-1, keepdims=True)
    logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ref_logp = np.take_along_axis(logq, np.asarray(tgt)[..., None], -1)[..., 0]
    ref_ent = -(np.exp(logq) * logq).sum(-1)
    tol = _logit_atol(h, w, 0.7)  # 6.6e-5 here; measured 1.9e-6 (log-probs) and 9.9e-6 (entropies)
    np.testing.assert_allclose(logp, ref_logp, rtol=0, atol=tol)
    np.testing.assert_allclose(ent, ref_ent, rtol=0, atol=tol)


@pytest.mark.parametrize("chunk", [1, 8, 37, 64])
def test_chunked_equals_naive_values_and_grads(chunk):
    h, w, tgt = _inputs()
    cot_l, cot_e = jax.random.normal(jax.random.key(1), (2, *tgt.shape))

    def objective(fn):
        def f(h, w):
            logp, ent = fn(h, w, tgt)
            return jnp.sum(logp * cot_l) + jnp.sum(ent * cot_e)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

    v1, (gh1, gw1) = objective(lambda h, w, t: token_logprobs(h, w, t, chunk=chunk))(h, w)
    v2, (gh2, gw2) = objective(token_logprobs_naive)(h, w)
    # two orderings of the same float32 work (tests/numerics.py), 3 reductions each: the logits (D terms), the
    # log-sum-exp (V) and the objective's sum over the 2 B T terms (v), the gradient's sum over V (gh) or over the
    # B T positions (gw); measured: 1.2e-5 (v), 2.6e-6 (gh), 4.8e-6 (gw) against 3e-4, 2.6e-5, 6.4e-5
    n_pos, V = tgt.size, w.shape[-1]
    z_max = float(np.abs(np.asarray(h, np.float64) @ np.asarray(w, np.float64)).max())
    c_max = float(jnp.abs(jnp.stack([cot_l, cot_e])).max())
    np.testing.assert_allclose(v1, v2, rtol=0, atol=reorder_atol(2 * n_pos, z_max * c_max, stages=3))
    np.testing.assert_allclose(gh1, gh2, rtol=0, atol=reorder_atol(V, float(jnp.abs(gh2).max()), stages=3))
    np.testing.assert_allclose(gw1, gw2, rtol=0, atol=reorder_atol(n_pos, float(jnp.abs(gw2).max()), stages=3))
    logp1, ent1 = token_logprobs(h, w, tgt, chunk=chunk)
    logp2, ent2 = token_logprobs_naive(h, w, tgt)
    np.testing.assert_allclose(logp1, logp2, rtol=0, atol=_logit_atol(h, w))
    np.testing.assert_allclose(ent1, ent2, rtol=0, atol=_logit_atol(h, w))


def test_bf16_hidden_and_bf16_head():
    h, w, tgt = _inputs(dtype=jnp.bfloat16)
    # float32 head: the bf16 hidden states are upcast exactly, so the result is the FP32 computation.
    logp, _ = token_logprobs(h, w, tgt, chunk=16)
    ref, _ = token_logprobs_naive(h.astype(jnp.float32), w, tgt)
    np.testing.assert_allclose(logp, ref, rtol=0, atol=_logit_atol(h, w))
    # bf16 head (the ablation): matches the naive bf16 computation and differs from FP32 by bf16 rounding.
    logp16, ent16 = token_logprobs(h, w, tgt, chunk=16, head_dtype="bfloat16")
    ref16, ent_ref16 = token_logprobs_naive(h, w, tgt, head_dtype="bfloat16")
    assert logp16.dtype == jnp.float32
    # both round the same bf16 products (the same logits), then reduce them in float32: float32's tolerance
    np.testing.assert_allclose(logp16, ref16, rtol=0, atol=_logit_atol(h, w))
    np.testing.assert_allclose(ent16, ent_ref16, rtol=0, atol=_logit_atol(h, w))
    err = np.abs(np.asarray(logp16) - np.asarray(logp)).max()
    assert 1e-4 < err < 0.5
    with pytest.raises(ValueError):
        token_logprobs(h, w, tgt, head_dtype="float16")


def _temp_bytes(fn, *args):
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_peak_memory_bounded():
    """Compiled scratch memory of the chunked forward and backward stays near one [B, chunk, V] block."""
    B, T, D, V, chunk = 2, 2048, 16, 8192, 128
    h = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
    w = jax.ShapeDtypeStruct((D, V), jnp.float32)
    tgt = jax.ShapeDtypeStruct((B, T), jnp.int32)
    full = B * T * V * 4  # one float32 [B, T, V] logits tensor: 128 MiB
    block = B * chunk * V * 4  # one chunk: 8 MiB

    def fwd(fn):
        return lambda h, w, t: fn(h, w, t)

    def grad(fn):
        return jax.grad(lambda h, w, t: sum(x.sum() for x in fn(h, w, t)), argnums=(0, 1))

    def chunked(h, w, t):
        return token_logprobs(h, w, t, chunk=chunk)

    for wrap in (fwd, grad):
        mem_naive = _temp_bytes(wrap(token_logprobs_naive), h, w, tgt)
        mem_chunk = _temp_bytes(wrap(chunked), h, w, tgt)
        assert mem_naive >= full
        assert mem_chunk <= 6 * block, (wrap.__name__, mem_chunk, block)
