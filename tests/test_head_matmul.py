"""The FP32 head's matmul options (scalerl_jax/models/head_matmul.py): each against float64 at Llama-3.2-1B's head
shape within the error its bf16 terms allow (derived in benchmarks/fp32_head.py), bf16x3 within 1 % of the FP32
head's own train/generator mismatch (and the single-bf16 option outside it), and the field wired into the logits and
the log-probs."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from scalerl_jax.benchmarks import fp32_head

from scalerl_jax.config import ConfigError
from scalerl_jax.losses.logprobs import token_logprobs
from scalerl_jax.models import init_params, lm_logits
from scalerl_jax.models.head_matmul import HEAD_MATMUL_TERMS, head_matmul, split_bf16
from scalerl_jax.models.presets import tiny

BF16 = ml_dtypes.bfloat16


@pytest.mark.parametrize("terms", [1, 2, 3])
def test_split_terms_sum_back_to_the_float32_value(terms):
    x = (np.random.default_rng(0).standard_normal(10_000) * 10.0 ** np.arange(-4, 6).repeat(1000)).astype(np.float32)
    parts = [np.asarray(t).astype(np.float64) for t in split_bf16(jnp.asarray(x), terms)]
    assert all(np.asarray(t).dtype == BF16 for t in split_bf16(jnp.asarray(x), terms))
    # each bf16 rounding leaves at most 2^-8 of what it rounds (8 significant bits, round to nearest)
    assert np.all(np.abs(x - sum(parts)) <= 2.0 ** (-8 * terms) * np.abs(x))


@pytest.fixture(scope="module")
def real_head():
    """Llama-3.2-1B's head shape (D 2048, V 128256) on 8 tokens, float64 log-probs of the float32 inputs, and the
    float64 log-probs of the generator's bf16 copy of the head (both computed here, in NumPy)."""
    n, d, v = 8, 2048, 128256
    h32, w32, tgt = fp32_head.make_inputs(n, d, v, logit_std=3.0, seed=1)

    def f64_logp(w):
        z = h32.astype(np.float64) @ w.astype(np.float64)
        m = z.max(axis=1)
        lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
        return z[np.arange(n), tgt] - lse

    w2 = w32.astype(np.float64) ** 2
    l2 = float(np.sqrt(((h32.astype(np.float64) ** 2) @ w2).max()))
    return h32, w32, tgt, f64_logp(w32), l2


def _logp(h32, w, tgt, impl):
    lp, _ = token_logprobs(jnp.asarray(h32)[None], jnp.asarray(w), jnp.asarray(tgt)[None], chunk=4,
                           head_matmul_impl=impl)
    return np.asarray(lp[0], np.float64)


@pytest.mark.extended  # Llama-3.2-1B's head (D 2048, V 128,256): a GPU option's numerics at its real shape
@pytest.mark.parametrize("impl", list(HEAD_MATMUL_TERMS))
def test_each_option_within_its_rounding_bound_at_real_shapes(real_head, impl):
    h32, w32, tgt, ref, l2 = real_head
    err = np.abs(_logp(h32, w32, tgt, impl) - ref).max()
    assert err <= fp32_head.bound(impl, h32.shape[1], l2), (impl, err)


@pytest.mark.extended
def test_bf16x3_keeps_the_fp32_heads_mismatch(real_head):
    """bf16x3's own error is at most 1 % of the train/generator mismatch the IEEE float32 head has against a
    generator holding the head in bf16; the single-bf16 option is not (so the criterion tells them apart)."""
    h32, w32, tgt, ref, _ = real_head
    w_gen = w32.astype(BF16).astype(np.float32)
    mismatch = np.abs(_logp(h32, w32, tgt, "reference") - _logp(h32, w_gen, tgt, "reference")).mean()
    assert mismatch > 0
    err = {impl: np.abs(_logp(h32, w32, tgt, impl) - ref).mean() for impl in ("bf16x3", "bf16")}
    assert err["bf16x3"] <= fp32_head.MISMATCH_SHARE * mismatch
    assert err["bf16"] > fp32_head.MISMATCH_SHARE * mismatch


def test_bf16_option_is_the_matmul_of_rounded_inputs_and_the_logits_read_the_field():
    cfg = dataclasses.replace(tiny(), head_matmul_impl="bf16")
    params = init_params(cfg, jax.random.key(0))
    h = np.asarray(jax.random.normal(jax.random.key(1), (2, 3, cfg.d_model)), np.float32)
    w = np.asarray(params["embed"].T if cfg.tie_embeddings else params["lm_head"], np.float32)
    want = h.astype(BF16).astype(np.float64) @ w.astype(BF16).astype(np.float64)
    got = np.asarray(lm_logits(params, jnp.asarray(h), cfg), np.float64)
    # bf16 x bf16 products are exact in float32; D float32 additions each round by <= 2^-24 of the partial sum
    tol = cfg.d_model * 2.0**-24 * (np.abs(h.astype(BF16).astype(np.float64)) @ np.abs(w.astype(BF16)).astype(
        np.float64))
    assert np.all(np.abs(got - want) <= tol)
    ref = np.asarray(lm_logits(params, jnp.asarray(h), dataclasses.replace(cfg, head_matmul_impl="reference")))
    assert np.abs(got - ref).max() > 0  # the field changes what the logits are


def test_gradients_through_the_split_terms_are_bf16_accurate():
    rng = np.random.default_rng(3)
    h = rng.standard_normal((16, 256)).astype(np.float32)
    w = (rng.standard_normal((256, 512)) * 0.05).astype(np.float32)
    c = rng.standard_normal((16, 512)).astype(np.float32)
    gh, gw = jax.grad(lambda h, w: jnp.sum(head_matmul(h, w, "bf16x3") * c), argnums=(0, 1))(h, w)
    c64, h64, w64 = c.astype(np.float64), h.astype(np.float64), w.astype(np.float64)
    # at worst as a single bf16 matmul's gradient: the other operand in bf16 (<= 2^-8 of each product), the
    # cotangent rounded to bf16 (<= 2^-8 of the sum), the split's residual (2^-16), a float32 accumulation over k
    # products (<= k 2^-24 of sum |c w|): elementwise |error| <= (2 x 2^-8 + 2^-16 + k 2^-24) x (|c| @ |w|^T)
    for got, want, absmm, k in ((gh, c64 @ w64.T, np.abs(c64) @ np.abs(w64).T, 512),
                                (gw, h64.T @ c64, np.abs(h64).T @ np.abs(c64), 16)):
        tol = (2 * 2.0**-8 + 2.0**-16 + k * 2.0**-24) * absmm
        assert np.all(np.abs(np.asarray(got, np.float64) - want) <= tol)


def test_an_unknown_choice_names_the_field():
    with pytest.raises(ConfigError, match="head_matmul_impl must be"):
        dataclasses.replace(tiny(), head_matmul_impl="tf32")
