"""Bad checkpoints and bad mesh shapes fail with errors that name what is wrong."""

import json

import numpy as np
import pytest

from scalerl_jax.config import ConfigError, MeshConfig
from scalerl_jax.models import CheckpointError, init_params, load_hf_checkpoint, save_hf_checkpoint, tiny
from scalerl_jax.models.hf_io import read_safetensors, write_safetensors
from scalerl_jax.sharding import make_mesh


@pytest.fixture
def ckpt(tmp_path):
    import jax

    cfg = tiny()
    save_hf_checkpoint(init_params(cfg, jax.random.key(0)), cfg, tmp_path)
    return tmp_path


def test_missing_tensor_is_named(ckpt):
    t = dict(read_safetensors(ckpt / "model.safetensors"))
    del t["model.layers.2.mlp.up_proj.weight"]
    write_safetensors({k: np.array(v) for k, v in t.items()}, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.mlp\.up_proj\.weight.*missing.*\[512, 128\]"):
        load_hf_checkpoint(ckpt)


def test_wrong_shape_names_expected_and_found(ckpt):
    t = {k: np.array(v) for k, v in read_safetensors(ckpt / "model.safetensors").items()}
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
