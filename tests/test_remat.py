"""Rematerialisation changes memory, never numbers: the layer's custom VJP (``remat_layer``: the layer input saved as
its raw integer bits, the layer recomputed in the backward pass) gives the loss and gradients of JAX's own
``jax.checkpoint`` (nothing saveable) to float rounding, for the dense Llama and the Llama-4 MoE, in float32 and
bfloat16 compute; in float32 both equal the plain backward pass without remat (in bfloat16 the recomputed
activations round differently, by up to ~3% of a gradient's largest entry, the same for both remat forms)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import scalerl_jax.models.layers as layers
from scalerl_jax.models import forward, init_params, tiny, tiny_moe
from scalerl_jax.models.layers import remat_layer


def _loss_and_grads(cfg, params, tokens, w):
    def loss(p):
        return (forward(p, tokens, cfg) * w).sum()

    return jax.jit(jax.value_and_grad(loss))(params)


def _max_rel(ga, gb) -> float:
    return max(float(jnp.abs(a - b).max()) / (float(jnp.abs(b).max()) + 1e-12)
               for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)))


# the dense model in float32 (compared exactly with the plain pass too) and the MoE in bfloat16 (the Scout numerics);
# the other two combinations add compile time, not coverage of remat_layer
@pytest.mark.parametrize("make, dtype", [(tiny, "float32"), (tiny_moe, "bfloat16")], ids=["llama-f32", "llama4-bf16"])
def test_remat_matches_jax_checkpoint_and_the_plain_backward_pass(make, dtype, monkeypatch):
    cfg = dataclasses.replace(make(), dtype=dtype, remat=False)
    params = init_params(cfg, jax.random.key(0), std=0.1)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
    w = jax.random.normal(jax.random.key(2), (2, 12, cfg.vocab_size))
    l_plain, g_plain = _loss_and_grads(cfg, params, tokens, w)
    l_ours, g_ours = _loss_and_grads(dataclasses.replace(cfg, remat=True), params, tokens, w)
    ckpt = lambda f, _dtype: jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable)  # noqa: E731
    monkeypatch.setattr(layers, "remat_layer", ckpt)
    l_ref, g_ref = _loss_and_grads(dataclasses.replace(cfg, remat=True), params, tokens, w)
    np.testing.assert_allclose(l_ours, l_ref, rtol=1e-6)
    assert _max_rel(g_ours, g_ref) <= 1e-5
    np.testing.assert_allclose(l_ours, l_plain, rtol=1e-5)
    assert _max_rel(g_ours, g_plain) <= (1e-5 if dtype == "float32" else 5e-2)


def test_remat_layer_against_its_definition():
    """A hand-checkable layer f(x, a) = (sin(x) * a, x.sum()): d/dx = cos(x) * a * ct0 + ct1, d/da = sin(x) * ct0,
    with x in bfloat16 (saved as uint16 bits)."""
    def f(x, a):
        return jnp.sin(x) * a, x.sum()

    g = remat_layer(f, jnp.bfloat16)
    x = jnp.asarray([0.5, -1.25, 2.0], jnp.bfloat16)
    a = jnp.asarray([2.0, 3.0, -1.0], jnp.bfloat16)
    out, vjp = jax.vjp(g, x, a)
    np.testing.assert_array_equal(out[0], f(x, a)[0])
    ct0, ct1 = jnp.asarray([1.0, 1.0, 0.5], jnp.bfloat16), jnp.asarray(2.0, jnp.bfloat16)
    dx, da = vjp((ct0, ct1))
    xf, af, cf = (np.asarray(v, np.float32) for v in (x, a, ct0))
    np.testing.assert_allclose(np.asarray(dx, np.float32), np.cos(xf) * af * cf + 2.0, rtol=2e-2)
    np.testing.assert_allclose(np.asarray(da, np.float32), np.sin(xf) * cf, rtol=2e-2)
    assert dx.dtype == jnp.bfloat16 and da.dtype == jnp.bfloat16
