"""Chunked FP32 token log-probs: equal to the naive computation (values, gradients), bounded memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.losses import token_logprobs, token_logprobs_naive
from tests.tolerances import entropy_err, head_reference, logit_err, logsoftmax_err, ops


def _inputs(B=2, T=37, D=16, V=97, seed=0, dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    h = jax.random.normal(k1, (B, T, D), jnp.float32).astype(dtype)
    w = jax.random.normal(k2, (D, V), jnp.float32) * 0.5
    tgt = jax.random.randint(k3, (B, T), 0, V)
    return h, w, tgt


def _reference(h, w, tgt, temperature=1.0):
    r = head_reference(h, w, tgt, temperature)
    return r["logq"], r["logp"], r["ent"], r["logp_err"], r["ent_err"]


def test_matches_numpy_definition():
    h, w, tgt = _inputs()
    logp, ent = token_logprobs(h, w, tgt, chunk=8, temperature=0.7)
    _, ref_logp, ref_ent, logp_err, ent_err = _reference(h, w, tgt, 0.7)
    assert np.all(np.abs(np.asarray(logp) - ref_logp) <= logp_err)
    assert np.all(np.abs(np.asarray(ent) - ref_ent) <= ent_err)


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
    # each within its bound of the float64 value and gradients (tests/tolerances.py); so the two within twice it
    ref = head_reference(h, w, tgt, 1.0, cot_l, cot_e)
    for v in (v1, v2):
        assert abs(float(v) - ref["value"]) <= ref["value_err"], (float(v), ref["value"], ref["value_err"])
    for gh, gw in ((gh1, gw1), (gh2, gw2)):
        assert np.all(np.abs(np.asarray(gh, np.float64) - ref["gh"]) <= ref["gh_err"])
        assert np.all(np.abs(np.asarray(gw, np.float64) - ref["gw"]) <= ref["gw_err"])
    logp1, ent1 = token_logprobs(h, w, tgt, chunk=chunk)
    logp2, ent2 = token_logprobs_naive(h, w, tgt)
    for logp, ent in ((logp1, ent1), (logp2, ent2)):
        assert np.all(np.abs(np.asarray(logp) - ref["logp"]) <= ref["logp_err"])
        assert np.all(np.abs(np.asarray(ent) - ref["ent"]) <= ref["ent_err"])


def test_bf16_hidden_and_bf16_head():
    h, w, tgt = _inputs(dtype=jnp.bfloat16)
    # float32 head: the bf16 hidden states are upcast exactly, so the result is the FP32 computation.
    logp, _ = token_logprobs(h, w, tgt, chunk=16)
    ref, _ = token_logprobs_naive(h.astype(jnp.float32), w, tgt)
    _, _, _, logp_err, _ = _reference(h, w, tgt)
    assert np.all(np.abs(np.asarray(logp) - np.asarray(ref)) <= 2 * logp_err)  # two float32 orderings
    # bf16 head (the ablation): matches the naive bf16 computation and differs from FP32 by bf16 rounding.
    logp16, ent16 = token_logprobs(h, w, tgt, chunk=16, head_dtype="bfloat16")
    ref16, ent_ref16 = token_logprobs_naive(h, w, tgt, head_dtype="bfloat16")
    assert logp16.dtype == jnp.float32
    # two orderings of the bf16 head: both round the logits to bfloat16 (each within logit_err's bf16 bound)
    logq16, _, _, _, _ = _reference(h, w, tgt)
    err16 = logsoftmax_err(logit_err(h, w, dtype="bfloat16") + ops(1, "bfloat16") * np.abs(
        np.asarray(h, np.float64) @ np.asarray(w, np.float64)))
    assert np.all(np.abs(np.asarray(logp16) - np.asarray(ref16)) <= 2 * err16)
    assert np.all(np.abs(np.asarray(ent16) - np.asarray(ent_ref16)) <= 2 * entropy_err(logq16, err16))
    # against FP32: bfloat16's rounding is visible (above float32's bound) and within bfloat16's
    err = np.abs(np.asarray(logp16) - np.asarray(logp))
    assert err.max() > 2 * logp_err.max() and np.all(err <= err16 + logp_err)
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
