"""Rematerialisation changes memory, never numbers: the layer's custom VJP (``remat_layer``: the layer input saved as
its raw integer bits, the layer recomputed in the backward pass) gives the loss and gradients of JAX's own
``jax.checkpoint`` (nothing saveable) to float rounding, for the dense Llama and the Llama-4 MoE, in float32 and
bfloat16 compute, and both equal the plain backward pass without remat: to float32 rounding in float32 (the
tolerances are derived in ``_tolerances``), in bfloat16 to a bfloat16 ulp of the recomputed activations (measured:
~3% of a gradient's largest entry, the same for both remat forms)."""

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


def _tolerances(cfg, terms) -> tuple[float, float]:
    """(loss atol, gradient tolerance relative to a leaf's largest entry) for two orderings of the same work.

    Every float32 result here is a chain of k = 2 + 2 n_layers rounded stages (the head, the loss's weighting and
    each layer's attention and MLP), each of which a different fusion may sum in another order: a change of at most
    eps of the magnitudes it summed per stage. The loss sums the terms l_i w_i (the sum cancels: |loss| ~ 1.8 against
    sum |l_i w_i| ~ 290 for the dense model, so a tolerance relative to the loss says nothing): each term moves by at
    most k eps of itself, both orderings may move, all in one direction at worst: 2 k eps sum |l_i w_i| (6.8e-4;
    two machines measured 1.8e-5 and 2.9e-5). A gradient entry sums its products over the n = B T positions, whose
    rounding errors add with random signs: 2 k sqrt(n) eps of the leaf's largest entry in float32 (1.2e-5; measured
    1.8e-6). In bfloat16 the backward pass's recomputed activations round again, each of the 2 n_layers recomputed
    block outputs possibly to the neighbouring bfloat16 value (one ulp, eps of itself), and a gradient is linear in
    them to first order: 2 n_layers eps_bf16 (6.3e-2; measured 2.5e-2). The loss is the forward pass's value, which
    remat does not recompute, and keeps the float32 bound in both dtypes."""
    k = 2 + 2 * cfg.n_layers
    eps32 = float(jnp.finfo(jnp.float32).eps)
    n = terms.shape[0] * terms.shape[1]
    loss_atol = 2 * k * eps32 * float(jnp.abs(terms).sum())
    if cfg.dtype == "float32":
        return loss_atol, 2 * k * np.sqrt(n) * eps32
    return loss_atol, 2 * cfg.n_layers * float(jnp.finfo(jnp.dtype(cfg.dtype)).eps)


# the dense model in float32 (compared exactly with the plain pass too) and the MoE in bfloat16 (the Scout numerics);
# the other two combinations add compile time, not coverage of remat_layer
@pytest.mark.parametrize("make, dtype", [(tiny, "float32"), (tiny_moe, "bfloat16")], ids=["llama-f32", "llama4-bf16"])
def test_remat_matches_jax_checkpoint_and_the_plain_backward_pass(make, dtype, monkeypatch):
    cfg = dataclasses.replace(make(), dtype=dtype, remat=False)
    params = init_params(cfg, jax.random.key(0), std=0.1)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
    w = jax.random.normal(jax.random.key(2), (2, 12, cfg.vocab_size))
    loss_atol, grad_tol = _tolerances(cfg, forward(params, tokens, cfg).astype(jnp.float32) * w)
    l_plain, g_plain = _loss_and_grads(cfg, params, tokens, w)
    l_ours, g_ours = _loss_and_grads(dataclasses.replace(cfg, remat=True), params, tokens, w)
    ckpt = lambda f, _dtype: jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable)  # noqa: E731
    monkeypatch.setattr(layers, "remat_layer", ckpt)
    l_ref, g_ref = _loss_and_grads(dataclasses.replace(cfg, remat=True), params, tokens, w)
    np.testing.assert_allclose(l_ours, l_ref, rtol=0, atol=loss_atol)
    np.testing.assert_allclose(l_ours, l_plain, rtol=0, atol=loss_atol)
    assert _max_rel(g_ours, g_ref) <= grad_tol
    assert _max_rel(g_ours, g_plain) <= grad_tol


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
    # in bfloat16 each of dx's 4 operations (cos, two products, a sum of terms of one sign here) rounds by at most
    # half an ulp (eps / 2) of its result, and cos itself may be off by an ulp: 3 eps; da's 2 operations: 2 eps
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    np.testing.assert_allclose(np.asarray(dx, np.float32), np.cos(xf) * af * cf + 2.0, rtol=3 * eps)
    np.testing.assert_allclose(np.asarray(da, np.float32), np.sin(xf) * cf, rtol=3 * eps)
    assert dx.dtype == jnp.bfloat16 and da.dtype == jnp.bfloat16
