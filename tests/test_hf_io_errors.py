"""Bad checkpoints and bad mesh shapes fail with errors that name what is wrong."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scalerl_jax.config import ConfigError, MeshConfig
from scalerl_jax.models import CheckpointError, init_params, load_hf_checkpoint, save_hf_checkpoint, tiny
from scalerl_jax.models.hf_io import write_safetensors
from scalerl_jax.sharding import make_mesh


@pytest.fixture
def ckpt(tmp_path):
    import jax

    cfg = tiny()
    save_hf_checkpoint(init_params(cfg, jax.random.key(0)), cfg, tmp_path)
    return tmp_path


def test_missing_tensor_is_named(ckpt):
    t = dict(load_file(ckpt / "model.safetensors"))
    del t["model.layers.2.mlp.up_proj.weight"]
    write_safetensors({k: np.array(v) for k, v in t.items()}, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.mlp\.up_proj\.weight.*missing.*\[512, 128\]"):
        load_hf_checkpoint(ckpt)


def test_wrong_shape_names_expected_and_found(ckpt):
    t = {k: np.array(v) for k, v in load_file(ckpt / "model.safetensors").items()}
    t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((32, 128), np.float32)
    write_safetensors(t, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"k_proj\.weight.*shape \[32, 128\], expected \[64, 128\]"):
        load_hf_checkpoint(ckpt)


def test_unknown_architecture(ckpt):
    c = json.loads((ckpt / "config.json").read_text())
    c["architectures"] = ["MistralForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(c))
    with pytest.raises(CheckpointError, match=r"architectures.*LlamaForCausalLM.*MistralForCausalLM"):
        load_hf_checkpoint(ckpt)


def test_truncated_file(ckpt):
    f = ckpt / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        load_hf_checkpoint(ckpt)


def test_safetensors_files_bf16_transposed_and_unsupported_dtype(ckpt, tmp_path_factory):
    """write_safetensors keeps bfloat16, writes non-C-ordered arrays in logical order and the {"format": "pt"}
    metadata transformers expects; a tensor of a dtype we do not read is named."""
    import ml_dtypes
    from safetensors import safe_open

    tmp_path = tmp_path_factory.mktemp("files")
    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
    write_safetensors({"a": a, "t": a.T}, tmp_path / "x.safetensors")
    with safe_open(tmp_path / "x.safetensors", framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.get_tensor("a").dtype == ml_dtypes.bfloat16 and np.array_equal(f.get_tensor("t"), a.T)
    with pytest.raises(CheckpointError, match="cannot write tensor 'o' of dtype object"):
        write_safetensors({"o": np.array([None])}, tmp_path / "y.safetensors")
    t = load_file(ckpt / "model.safetensors")
    t["model.norm.weight"] = t["model.norm.weight"].astype(np.int32)
    save_file(t, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError,
                       match=r"model\.safetensors: tensor 'model\.norm\.weight' has unsupported dtype 'I32'"):
        load_hf_checkpoint(ckpt)


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="config.json not found"):
        load_hf_checkpoint(tmp_path)


def test_mesh_shape_must_divide_devices():
    with pytest.raises(ConfigError, match="does not divide"):
        MeshConfig(fsdp=-1, tensor=3).resolve(8)
    with pytest.raises(ConfigError, match="multiply to 6 but 8 devices"):
        MeshConfig(data=1, fsdp=3, tensor=2).resolve(8)
    with pytest.raises(ConfigError, match="at most one axis"):
        MeshConfig(data=-1, fsdp=-1).resolve(8)
    import jax

    with pytest.raises(ConfigError):
        make_mesh(MeshConfig(fsdp=2, tensor=2), jax.devices()[:1])


@pytest.mark.parametrize("arch", ["llama", "llama4"])
def test_rope_fields_both_transformers_layouts(arch):
    """llama3 RoPE scaling read from transformers-5 ``rope_parameters`` and from transformers-4 ``rope_scaling``
    (with the old ``type`` key) gives the same config; an unknown type or a missing field is named."""
    from scalerl_jax.models import hf_io, presets

    cfg = presets.llama3_8b() if arch == "llama" else presets.scout_17b16e()
    hf = hf_io.config_to_hf(cfg, "bfloat16") if arch == "llama" else hf_io.hf_llama4.config_to_hf(cfg, "bfloat16")
    assert hf_io.config_from_hf(hf).rope_scaling == cfg.rope_scaling and cfg.rope_scaling is not None
    scaling = {k: v for k, v in hf["rope_parameters"].items() if k not in ("rope_type", "rope_theta")}
    v4 = {k: v for k, v in hf.items() if k != "rope_parameters"} | {"rope_scaling": {"type": "llama3", **scaling}}
    got = hf_io.config_from_hf(v4)
    assert (got.rope_scaling, got.rope_theta) == (cfg.rope_scaling, cfg.rope_theta)
    bad = {**hf, "rope_parameters": {**hf["rope_parameters"], "rope_type": "yarn"}}
    with pytest.raises(CheckpointError,
                       match="config.json: field 'rope_type' expected 'default' or 'llama3', found 'yarn'"):
        hf_io.config_from_hf(bad)
    short = {**hf, "rope_parameters": {k: v for k, v in hf["rope_parameters"].items() if k != "low_freq_factor"}}
    with pytest.raises(CheckpointError, match=r"missing field\(s\) \['low_freq_factor'\]"):
        hf_io.config_from_hf(short)
