"""Parity of our Llama-4 text model (arch="llama4") with HF transformers' Llama4ForCausalLM, its checkpoint
round trip, and the dense / ragged MoE dispatch paths against each other."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from scalerl_jax.models import forward, forward_cached, init_cache, lm_logits, load_hf_checkpoint, save_hf_checkpoint
from scalerl_jax.models.llama4 import period
from tests.hf_models import make_hf_llama4, torch_logits
from tests.tolerances import gamma, max_rel, model_rel


def _ours(params, tokens, cfg, **kw):
    cfg = dataclasses.replace(cfg, dtype="float32", **kw)
    return np.asarray(forward(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens), cfg))


@pytest.mark.parametrize(
    "kw",
    [
        dict(),  # MoE on layers 1, 3; NoPE on 1, 3; chunk 4 < T; QK norm; temperature tuning; llama3 RoPE
        dict(moe_step=1, nope_interval=4, top_k=2, experts=3, qk_norm=False, llama3_rope=False),  # all MoE, top-2
        dict(layers=6, moe_step=3, nope_interval=2, chunk=5, temp_tuning=False),  # period 6
    ],
)
def test_logits_match_transformers(tmp_path, kw):
    model = make_hf_llama4(tmp_path, **kw)
    params, cfg = load_hf_checkpoint(tmp_path)
    assert cfg.arch == "llama4" and cfg.moe_every == kw.get("moe_step", 2)
    assert cfg.nope_every == kw.get("nope_interval", 2) and cfg.top_k == kw.get("top_k", 1)
    tokens = np.random.RandomState(1).randint(0, 97, (2, 19))  # spans several attention chunks
    ref = torch_logits(model, tokens)
    # the dense softmax path, the flash (tiled) path, and both MoE dispatches all match HF: two float32 orderings of
    # one forward pass each (tests/tolerances.py), relative to the largest logit
    tol = model_rel(cfg, tokens.shape[1])
    for kw in ({}, {"attn_chunk": 4}, {"moe_impl": "dense"}, {"remat": True}):
        assert max_rel(_ours(params, tokens, cfg, **kw), ref) <= tol, kw


def test_router_actually_routes_to_several_experts(tmp_path):
    """Guards the parity test against a degenerate router (every token on one expert would hide dispatch bugs)."""
    from scalerl_jax.models.llama4 import forward_hidden

    make_hf_llama4(tmp_path)
    params, cfg = load_hf_checkpoint(tmp_path)
    tokens = np.random.RandomState(1).randint(0, 97, (2, 19))
    _, stats = forward_hidden(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens), cfg, return_aux=True)
    load = np.asarray(stats["load"])
    assert load.shape == (cfg.n_moe_layers, cfg.n_experts)
    # fractions of the tokens, each rounded in float32, summed over the experts
    np.testing.assert_allclose(load.sum(-1), 1.0, rtol=0, atol=gamma(2 * cfg.n_experts))
    assert (load > 0).sum(-1).min() >= 3
    np.testing.assert_array_equal(np.asarray(stats["kept"]), 1.0)


def test_kv_cached_decode_matches_full_forward(tmp_path):
    make_hf_llama4(tmp_path)
    params, cfg = load_hf_checkpoint(tmp_path)
    p = jax.tree.map(jnp.asarray, params)
    tokens = np.random.RandomState(2).randint(0, 97, (2, 14))
    full = _ours(params, tokens, cfg)
    cache = init_cache(cfg, 2, 16)
    h, cache = forward_cached(p, jnp.asarray(tokens[:, :6]), jnp.broadcast_to(jnp.arange(6), (2, 6)), cache, cfg)
    outs = [np.asarray(lm_logits(p, h, cfg))]
    for t in range(6, 14):
        h, cache = forward_cached(p, jnp.asarray(tokens[:, t : t + 1]), jnp.full((2, 1), t), cache, cfg)
        outs.append(np.asarray(lm_logits(p, h, cfg)))
    assert max_rel(np.concatenate(outs, 1), full) <= model_rel(cfg, tokens.shape[1])  # two float32 orderings


def test_save_load_round_trip_is_bitwise_and_transformers_loads_it(tmp_path):
    from transformers import Llama4ForCausalLM

    make_hf_llama4(tmp_path / "src")
    params, cfg = load_hf_checkpoint(tmp_path / "src")
    save_hf_checkpoint(params, cfg, tmp_path / "out")
    params2, cfg2 = load_hf_checkpoint(tmp_path / "out")
    assert cfg2 == cfg
    chex.assert_trees_all_equal(params, params2, strict=True)  # same structure, shapes, dtypes and bits
    src = load_file(tmp_path / "src" / "model.safetensors")
    out = load_file(tmp_path / "out" / "model.safetensors")
    assert set(src) == set(out)
    for name in src:
        assert np.array_equal(src[name], out[name]), name
    model = Llama4ForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    tokens = np.random.RandomState(3).randint(0, 97, (1, 11))
    assert max_rel(torch_logits(model, tokens), _ours(params, tokens, cfg)) <= model_rel(cfg, tokens.shape[1])


def test_layer_period():
    from scalerl_jax.models.presets import get_preset

    scout = get_preset("scout_17b16e")
    assert period(scout) == 4 and scout.n_moe_layers == 48
    assert period(dataclasses.replace(scout, moe_every=2)) == 4
    assert period(dataclasses.replace(scout, moe_every=3, n_layers=12)) == 12
