"""The MoE router's load-balancing loss (``LossConfig.moe_aux_coef``, models/moe.py ``load_balancing_loss``).

Checked against a NumPy re-derivation from the router logits and against HF transformers'
``load_balancing_loss_func`` (Mixtral's, the Switch-Transformer loss HF's Llama-4 config weighs with
``router_aux_loss_coef``) on the same logits, value and gradient (torch autograd) over several layers and top-k;
the RL loss adds ``moe_aux_coef`` x the logged ``moe_aux_loss`` and nothing when the coefficient is 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from scalerl_jax.config import ConfigError, LossConfig
from scalerl_jax.models import init_params, tiny_moe
from scalerl_jax.models.moe import load_balancing_loss, moe_ffn
from scalerl_jax.train.rl import rl_loss
from tests.tolerances import max_rel, model_rel, ops, rl_loss_scale, sum_rel


def _layers(n_layers: int, top_k: int, seed=0):
    cfg = dataclasses.replace(tiny_moe(), top_k=top_k, moe_impl="dense")
    moe = init_params(cfg, jax.random.key(seed), std=0.3)["moe"]  # [Lm, ...] for the tiny model's 2 MoE layers
    layers = [jax.tree.map(lambda a, i=i: a[i % a.shape[0]], moe) for i in range(n_layers)]
    routers = [np.asarray(jax.random.normal(jax.random.key(seed + 10 + i), (cfg.d_model, cfg.n_experts))) * 0.2
               for i in range(n_layers)]
    for lp, w in zip(layers, routers):
        lp["router"] = jnp.asarray(w)
    h = jax.random.normal(jax.random.key(seed + 1), (2, 9, cfg.d_model), jnp.float32)
    return cfg, layers, h


def _aux(routers, layers, h, cfg):
    stats = [moe_ffn(h, dict(lp, router=w), cfg)[1] for lp, w in zip(layers, routers)]
    load = jnp.stack([s["load"] for s in stats])
    prob = jnp.stack([s["prob"] for s in stats])
    return load_balancing_loss(load, prob, cfg.top_k), (load, prob)


@pytest.mark.parametrize("n_layers, top_k", [(2, 1), (3, 2)])
def test_matches_numpy_and_transformers(n_layers, top_k):
    cfg, layers, h = _layers(n_layers, top_k)
    routers = [lp["router"] for lp in layers]
    (aux, (load, prob)), grads = jax.value_and_grad(_aux, has_aux=True)(routers, layers, h, cfg)

    # NumPy: per layer, logits z = h W; f_e = (top-k assignments to e) / tokens; P_e = mean softmax(z)_e
    h64 = np.asarray(h, np.float64).reshape(-1, cfg.d_model)
    E, N = cfg.n_experts, h64.shape[0]
    f_sum, p_sum = np.zeros(E), np.zeros(E)
    for li, w in enumerate(routers):
        z = h64 @ np.asarray(w, np.float64)
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        top = np.argsort(-z, axis=-1)[:, :top_k]
        counts = np.bincount(top.reshape(-1), minlength=E)
        # the layer's stats (tests/tolerances.py): a count over N top_k, one float32 division of exact integers;
        # a mean over N tokens of a softmax (its logits from a dot product of d_model terms, its sum over E)
        np.testing.assert_allclose(np.asarray(load[li]), counts / (N * top_k), rtol=ops(1), atol=0)
        z_err = float(np.abs(z).max()) * sum_rel(cfg.d_model)
        prob_rel = 2 * z_err + sum_rel(E) + ops(2, transcendental=1) + sum_rel(N)
        np.testing.assert_allclose(np.asarray(prob[li]), p.mean(0), rtol=prob_rel, atol=0)
        f_sum += counts / N
        p_sum += p.mean(0)
    expected = E * np.sum((f_sum / n_layers) * (p_sum / n_layers))
    # E x sum over E experts of products of those means (all positive: no cancellation)
    aux_rel = prob_rel + ops(1) + sum_rel(n_layers) + sum_rel(E) + ops(3)
    np.testing.assert_allclose(float(aux), expected, rtol=aux_rel)

    # transformers: the same logits as a tuple of [tokens, E] tensors, one per layer; gradient by autograd
    w_t = [torch.tensor(np.asarray(w, np.float64), requires_grad=True) for w in routers]
    h_t = torch.tensor(h64)
    hf = load_balancing_loss_func(tuple(h_t @ w for w in w_t), num_experts=E, top_k=top_k)
    hf.backward()
    np.testing.assert_allclose(float(aux), hf.item(), rtol=aux_rel)  # transformers in float64
    # d aux / d W = h^T (d aux / d z): a softmax's Jacobian (E terms) contracted over the N tokens (tests/tolerances.py)
    g_rel = 2 * prob_rel + sum_rel(E) + sum_rel(N)
    for g, w in zip(grads, w_t):
        ref = w.grad.numpy()
        assert max_rel(np.asarray(g), ref) <= g_rel, (max_rel(np.asarray(g), ref), g_rel)
    assert max(float(np.abs(np.asarray(g)).max()) for g in grads) > 1e-4  # a gradient worth comparing


def test_uniform_router_gives_top_k():
    """All-zero router weights: every P_e = 1/E, the assignments sum to top_k per token, so the loss is top_k
    (its minimum over f for uniform P)."""
    cfg, layers, h = _layers(2, 2)
    routers = [jnp.zeros_like(lp["router"]) for lp in layers]
    aux, _ = _aux(routers, layers, h, cfg)
    assert abs(float(aux) - 2.0) <= 2.0 * ops(2 * cfg.n_experts + 4)  # exact 1/E and counts: sums and products


def _batch(cfg, B=2, T=10):
    rng = np.random.RandomState(0)
    mask = np.zeros((B, T), np.float32)
    mask[:, 3:] = 1.0
    return {
        "tokens": rng.randint(0, cfg.vocab_size, (B, T)).astype(np.int32), "loss_mask": mask,
        "gen_logp": (mask * rng.uniform(-4, -0.5, (B, T))).astype(np.float32),
        "staleness": np.zeros((B, T), np.int32), "advantages": np.array([1.0, -1.0], np.float32),
        "rewards": np.array([1.0, -1.0], np.float32), "group_ids": np.zeros(B, np.int32),
        "truncated": np.zeros(B, np.float32),
    }


def test_rl_loss_adds_the_weighted_aux_loss():
    cfg = tiny_moe()
    params = init_params(cfg, jax.random.key(0), std=0.1)
    batch = _batch(cfg)
    loss0, m0 = jax.jit(rl_loss(cfg, LossConfig()))(params, batch)
    loss1, m1 = jax.jit(rl_loss(cfg, LossConfig(moe_aux_coef=0.25)))(params, batch)
    aux = float(m0["moe_aux_loss"])
    assert aux > 0.1  # logged whatever the coefficient (0 in m0)
    # the same float32 work in two programs (another fusion): the aux loss is positive terms; the losses add one
    # product and one sum to the policy loss, whose own terms may cancel (tests/tolerances.py)
    rel = model_rel(cfg, _batch(cfg)["tokens"].shape[1])
    loss_scale, _ = rl_loss_scale(cfg, params, batch)
    np.testing.assert_allclose(float(m1["moe_aux_loss"]), aux, rtol=rel)
    np.testing.assert_allclose(float(loss1), float(loss0) + 0.25 * aux, rtol=0, atol=rel * (loss_scale + aux))
    np.testing.assert_allclose(float(m1["policy_loss"]), float(loss0), rtol=0, atol=rel * loss_scale)
    assert float(m0["loss"]) == float(loss0) and float(m1["loss"]) == float(loss1)  # the logged loss is the loss
    with pytest.raises(ConfigError, match="moe_aux_coef"):
        LossConfig(moe_aux_coef=-0.1)
