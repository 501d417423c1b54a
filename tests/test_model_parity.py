"""Parity of our Llama with HF transformers, and HF checkpoint round trips."""

import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from scalerl_jax.models import forward, load_hf_checkpoint, save_hf_checkpoint
from tests.hf_models import make_hf_llama, torch_logits
from tests.tolerances import max_rel, model_rel


def _ours(params, tokens, cfg):
    cfg = dataclasses.replace(cfg, dtype="float32")
    return np.asarray(forward(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens), cfg))


@pytest.mark.parametrize(
    "kw",
    [
        dict(heads=4, kv_heads=2, tied=False, llama3_rope=True),  # GQA + llama3 scaling + untied
        dict(heads=4, kv_heads=4, tied=True, llama3_rope=False),  # MHA + default rope + tied
        dict(heads=8, kv_heads=1, tied=False, llama3_rope=True, layers=3),  # MQA
    ],
)
def test_logits_match_transformers(tmp_path, kw):
    model = make_hf_llama(tmp_path, **kw)
    params, cfg = load_hf_checkpoint(tmp_path)
    assert cfg.tie_embeddings == kw["tied"] and cfg.n_kv_heads == kw["kv_heads"]
    assert (cfg.rope_scaling is not None) == kw["llama3_rope"]
    tokens = np.random.RandomState(1).randint(0, 97, (2, 48))  # > original_max_position_embeddings (16)
    # two float32 orderings of one forward pass (tests/tolerances.py), relative to the largest logit
    assert max_rel(_ours(params, tokens, cfg), torch_logits(model, tokens)) <= model_rel(cfg, tokens.shape[1])


def test_save_load_round_trip_is_bitwise_and_transformers_loads_it(tmp_path):
    from transformers import LlamaForCausalLM

    make_hf_llama(tmp_path / "src", tied=False)
    params, cfg = load_hf_checkpoint(tmp_path / "src")
    save_hf_checkpoint(params, cfg, tmp_path / "out")
    params2, cfg2 = load_hf_checkpoint(tmp_path / "out")
    assert cfg2 == cfg
    chex.assert_trees_all_equal(params, params2, strict=True)  # same structure, shapes, dtypes and bits
    # the HF tensors themselves are bitwise equal to the source checkpoint
    src, out = load_file(tmp_path / "src" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert set(src) == set(out)
    for name in src:
        assert np.array_equal(src[name], out[name]), name
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    tokens = np.random.RandomState(2).randint(0, 97, (2, 24))
    assert max_rel(torch_logits(reloaded, tokens), _ours(params, tokens, cfg)) <= model_rel(cfg, tokens.shape[1])


def test_sharded_checkpoint_and_bf16(tmp_path):
    from transformers import LlamaForCausalLM

    make_hf_llama(tmp_path / "src")
    params, cfg = load_hf_checkpoint(tmp_path / "src")
    save_hf_checkpoint(params, cfg, tmp_path / "sharded", max_shard_bytes=20_000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    params2, _ = load_hf_checkpoint(tmp_path / "sharded")
    chex.assert_trees_all_equal(params, params2, strict=True)
    save_hf_checkpoint(params, cfg, tmp_path / "bf16", dtype="bfloat16")
    cfg_json = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert cfg_json["torch_dtype"] == "bfloat16"
    m = LlamaForCausalLM.from_pretrained(tmp_path / "bf16", dtype="float32").eval()
    tokens = np.random.RandomState(3).randint(0, 97, (1, 16))
    # bf16 storage rounds the weights to 8 mantissa bits: transformers' logits from the stored checkpoint are ours
    # from the same rounded weights, to float32's reordering (tests/tolerances.py)
    rounded = jax.tree.map(lambda a: np.asarray(a).astype(jnp.bfloat16).astype(np.float32), params)
    assert max_rel(torch_logits(m, tokens), _ours(rounded, tokens, cfg)) <= model_rel(cfg, tokens.shape[1])
