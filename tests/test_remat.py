"""Rematerialisation changes memory, never numbers: the layer's custom VJP (``remat_layer``: the layer input saved as
its raw integer bits, the layer recomputed in the backward pass) gives the loss and gradients of JAX's own
``jax.checkpoint`` (nothing saveable) to float rounding, for the dense Llama and the Llama-4 MoE, in float32 and
bfloat16 compute, and both equal the plain backward pass without remat: in float32 to what reordering the network's
reductions can change, in bfloat16 (where the recomputed activations round differently, by ~3% of a gradient's
largest entry) to a few times the plain pass's own error against float32 (tests/tolerances.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import scalerl_jax.models.layers as layers
from scalerl_jax.models import forward, init_params, tiny, tiny_moe
from scalerl_jax.models.layers import remat_layer
from tests.tolerances import max_rel, model_rel, ops, own_error_tol, reorder_rel


def _loss_and_grads(cfg, params, tokens, w):
    def loss(p):
        return (forward(p, tokens, cfg) * w).sum()

    return jax.jit(jax.value_and_grad(loss))(params)


# the dense model in float32 (compared exactly with the plain pass too) and the MoE in bfloat16 (the Scout numerics:
# half a minute of compiles, a GPU preset's path, so one of CI's extended checks); the other two combinations add
# compile time, not coverage of remat_layer
@pytest.mark.parametrize("make, dtype", [(tiny, "float32"), pytest.param(tiny_moe, "bfloat16",
                                                                         marks=pytest.mark.extended)],
                         ids=["llama-f32", "llama4-bf16"])
def test_remat_matches_jax_checkpoint_and_the_plain_backward_pass(make, dtype, monkeypatch):
    cfg = dataclasses.replace(make(), dtype=dtype, remat=False)
    params = init_params(cfg, jax.random.key(0), std=0.1)
    B, T = 2, 12
    tokens = jax.random.randint(jax.random.key(1), (B, T), 0, cfg.vocab_size)
    w = jax.random.normal(jax.random.key(2), (B, T, cfg.vocab_size))
    l_plain, g_plain = _loss_and_grads(cfg, params, tokens, w)
    l_ours, g_ours = _loss_and_grads(dataclasses.replace(cfg, remat=True), params, tokens, w)
    ckpt = lambda f, _dtype: jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable)  # noqa: E731
    monkeypatch.setattr(layers, "remat_layer", ckpt)
    l_ref, g_ref = _loss_and_grads(dataclasses.replace(cfg, remat=True), params, tokens, w)
    monkeypatch.undo()
    logits = forward(params, tokens, cfg)
    if dtype == "float32":
        # three float32 orderings of the same work (XLA fuses the recomputation differently): the logits and the
        # gradients may differ by what reordering the network's reductions can change (tests/tolerances.py)
        rel_logits, rel_grads = model_rel(cfg, T), model_rel(cfg, T, backward=True)
    else:
        # bfloat16 activations: the recomputed ones may round differently; the scale is the plain pass's own error
        # against the same model in float32 (tests/tolerances.py)
        f32 = dataclasses.replace(cfg, dtype="float32")
        rel_logits = own_error_tol(logits, forward(params, tokens, f32))
        rel_grads = own_error_tol(g_plain, _loss_and_grads(f32, params, tokens, w)[1])
    # the loss sums B * T * V logits times w: each logit off by at most rel_logits x the largest, and the sum's own
    # reordering on top
    n = B * T * cfg.vocab_size
    loss_tol = (rel_logits * float(jnp.abs(logits).max()) * float(jnp.abs(w).sum())
                + reorder_rel(n) * float(jnp.abs(logits * w).sum()))
    for l_other in (l_ref, l_plain):
        assert abs(float(l_ours) - float(l_other)) <= loss_tol, (float(l_ours), float(l_other), loss_tol)
    assert max_rel(g_ours, g_ref) <= rel_grads, (max_rel(g_ours, g_ref), rel_grads)
    assert max_rel(g_ours, g_plain) <= rel_grads, (max_rel(g_ours, g_plain), rel_grads)


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
    # in bfloat16 from exact bfloat16 inputs: cos, two products, the sum (no cancellation: both terms positive here)
    # and the output's rounding; sin, one product and the output's rounding (tests/tolerances.py)
    np.testing.assert_allclose(np.asarray(dx, np.float32), np.cos(xf) * af * cf + 2.0,
                               rtol=ops(4, "bfloat16", transcendental=1))
    np.testing.assert_allclose(np.asarray(da, np.float32), np.sin(xf) * cf, rtol=ops(2, "bfloat16", transcendental=1))
    assert dx.dtype == jnp.bfloat16 and da.dtype == jnp.bfloat16
