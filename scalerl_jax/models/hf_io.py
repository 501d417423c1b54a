"""HF ``LlamaForCausalLM`` (and, via :mod:`hf_qwen`, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` and
``Qwen3MoeForCausalLM``; via :mod:`hf_llama4`, ``Llama4ForCausalLM``) checkpoints (config.json + single or sharded
safetensors) <-> our params.

Files are read and written with the ``safetensors`` library (NumPy API; ``ml_dtypes`` gives NumPy its
bfloat16, so no torch): on load each tensor is read only when its param is filled, then dropped, so peak
memory is the params plus one tensor. What we write loads in transformers and SGLang (tests check
transformers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import hf_llama4, hf_qwen
from scalerl_jax.models.hf_rope import rope_from_hf, rope_to_hf
from scalerl_jax.models.layers import dtype as to_dtype
from scalerl_jax.models.model import param_shapes
from scalerl_jax.models.params import Params


class CheckpointError(ValueError):
    """A checkpoint is unreadable or does not match what the config says; the message names the file,
    tensor or field and the expected vs found value."""


_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
SUPPORTED_ARCHS = (*hf_qwen.ARCHS, *hf_llama4.ARCHS)


# ---- safetensors files -----------------------------------------------------------------------------


def write_safetensors(tensors: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """Write tensors to one .safetensors file with the ``{"format": "pt"}`` metadata transformers expects,
    atomically (a temp file renamed into place)."""
    arrays = {}
    for name, a in tensors.items():
        if np.dtype(a.dtype) not in _NAMES:
            raise CheckpointError(f"cannot write tensor {name!r} of dtype {a.dtype}")
        arrays[name] = np.ascontiguousarray(a)  # save_file writes the raw buffer: it must be C-ordered
    tmp = Path(str(path) + ".tmp")
    try:
        save_file(arrays, tmp, metadata={"format": "pt"})
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _open_safetensors(path: Path, stack: contextlib.ExitStack):
    """``safe_open`` handle of one file (closed with ``stack``). The pread backend reads a tensor's bytes
    only when it is asked for, into a buffer of its own, and maps nothing, so reading a checkpoint tensor
    by tensor never keeps the file set resident (a slice of a tensor, though, reads the whole tensor)."""
    try:
        return stack.enter_context(safe_open(path, framework="numpy", backend="pread"))
    except SafetensorError as e:
        raise CheckpointError(f"{path}: not a readable safetensors file: truncated or corrupt ({e})") from e
    except OSError as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e


# ---- config ----------------------------------------------------------------------------------------


def hf_arch(hf: dict[str, Any], source: str = "config.json") -> str:
    """Our ``ModelConfig.arch`` for an HF config dict, decided by its ``architectures`` field (or, without one, its
    ``model_type``); anything else is refused here, before a tensor is read, naming what is supported."""
    if hf_llama4.is_llama4(hf):
        return "llama4"
    archs = hf.get("architectures")
    if archs is not None:
        for a in archs:
            if a in hf_qwen.ARCHS:
                return hf_qwen.ARCHS[a]
        raise CheckpointError(f"{source}: field 'architectures' expected one of {SUPPORTED_ARCHS}, found {archs}")
    if hf.get("model_type") not in hf_qwen.MODEL_TYPES:
        raise CheckpointError(f"{source}: field 'model_type' expected one of "
                              f"{(*hf_qwen.MODEL_TYPES, 'llama4', 'llama4_text')} (no 'architectures' field), found "
                              f"{hf.get('model_type')!r}")
    return hf_qwen.MODEL_TYPES[hf["model_type"]]


def config_from_hf(hf: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """ModelConfig from an HF Llama, Qwen2, Qwen3, Qwen3-MoE or Llama-4 config dict (transformers 4
    ``rope_scaling`` or 5 ``rope_parameters``)."""
    arch = hf_arch(hf, source)
    if arch == "llama4":
        return hf_llama4.config_from_hf(hf, source, CheckpointError)
    if hf.get("mlp_bias"):
        raise CheckpointError(f"{source}: field 'mlp_bias' expected false (biases unsupported), found true")
    if arch == "llama" and hf.get("attention_bias"):
        raise CheckpointError(f"{source}: field 'attention_bias' expected false (biases unsupported), found true")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{source}: field 'hidden_act' expected 'silu', found {hf['hidden_act']!r}")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if key not in hf:
            raise CheckpointError(f"{source}: required field {key!r} is missing")
    extra = hf_qwen.config_fields(hf, arch, source, CheckpointError)
    theta, scaling = rope_from_hf(hf, source, CheckpointError, default_theta=10000.0)
    n_heads = hf["num_attention_heads"]
    dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    eos = hf.get("eos_token_id")
    return ModelConfig(
        arch=arch, vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads, ffn_dim=hf["intermediate_size"],
        rope_theta=float(theta), rope_scaling=scaling,
        rms_eps=float(hf.get("rms_norm_eps", 1e-5 if arch == "llama" else 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=int(hf.get("max_position_embeddings", 8192)),
        dtype="bfloat16" if dtype == "bfloat16" else "float32", param_dtype="float32",
        bos_token_id=hf.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos,
        pad_token_id=hf.get("pad_token_id"), **extra,
    )


def hf_names(cfg: ModelConfig) -> tuple[str, str]:
    """(HF ``architectures`` entry, ``model_type``) of ``cfg.arch``: what a server reports and a push writes."""
    return ("Llama4ForCausalLM", "llama4_text") if cfg.arch == "llama4" else hf_qwen.HF_NAMES[cfg.arch]


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    """HF config dict of ``cfg``'s own architecture (Llama's: both the transformers-5 and the legacy RoPE
    fields)."""
    if cfg.arch == "llama4":
        return hf_llama4.config_to_hf(cfg, dtype)
    rope_params, legacy_scaling = rope_to_hf(cfg.rope_theta, cfg.rope_scaling)
    return hf_qwen.config_to_hf(cfg, {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "intermediate_size": cfg.ffn_dim,
        "hidden_act": "silu", "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": legacy_scaling, "rope_parameters": rope_params,
        "max_position_embeddings": cfg.max_seq_len, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id, "torch_dtype": dtype, "dtype": dtype,
        "use_cache": True,
    })


# ---- tensor name mapping ----------------------------------------------------------------------------
# (our layer key, HF suffix): the attention half, then the dense MLP
_LAYER_MAP = [
    ("attn_norm", "input_layernorm.weight"),
    ("wq", "self_attn.q_proj.weight"),
    ("wk", "self_attn.k_proj.weight"),
    ("wv", "self_attn.v_proj.weight"),
    ("wo", "self_attn.o_proj.weight"),
    ("mlp_norm", "post_attention_layernorm.weight"),
    ("w_gate", "mlp.gate_proj.weight"),
    ("w_up", "mlp.up_proj.weight"),
    ("w_down", "mlp.down_proj.weight"),
]


def layer_map(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our ``layers`` key, HF suffix) of every stacked per-layer tensor of a dense or Qwen3-MoE model (the MoE
    model's ``layers`` hold its attention half only; its FFN tensors are :mod:`hf_qwen`'s)."""
    attn = _LAYER_MAP[:6] + hf_qwen.attention_extras(cfg)
    return attn if cfg.is_moe else attn + _LAYER_MAP[6:]


def _to_hf_layout(key: str, w: np.ndarray) -> np.ndarray:
    """Our per-layer tensor -> torch Linear layout [out, in]."""
    if key in ("bq", "bk", "bv"):  # [H, Dh] -> [H*Dh]
        return w.reshape(-1)
    if key in ("wq", "wk", "wv"):  # [D, H, Dh] -> [H*Dh, D]
        return w.reshape(w.shape[0], -1).T
    if key == "wo":  # [H, Dh, D] -> [D, H*Dh]
        return w.reshape(-1, w.shape[-1]).T
    if key in ("w_gate", "w_up", "w_down"):  # [in, out] -> [out, in]
        return w.T
    return w


def _from_hf_layout(key: str, w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    if key in ("bq", "bk", "bv"):
        return w.reshape(shape)
    if key in ("wq", "wk", "wv"):
        return w.T.reshape(shape)
    if key == "wo":
        return w.T.reshape(shape)
    if key in ("w_gate", "w_up", "w_down"):
        return w.T
    return w


def _hf_layer_shape(key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    if key in ("bq", "bk", "bv"):
        return (shape[0] * shape[1],)
    if key in ("wq", "wk", "wv"):
        return (shape[1] * shape[2], shape[0])
    if key == "wo":
        return (shape[2], shape[0] * shape[1])
    if key in ("w_gate", "w_up", "w_down"):
        return (shape[1], shape[0])
    return shape


def _collect_tensors(path: Path, stack: contextlib.ExitStack) -> dict[str, tuple[Any, str, tuple[int, ...]]]:
    """Tensor name -> (open handle of its file, file name, shape); no tensor data is read."""
    index = path / "model.safetensors.index.json"
    files: list[Path]
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: invalid index ({e})") from e
        files = [path / f for f in sorted(set(weight_map.values()))]
    elif (path / "model.safetensors").exists():
        files = [path / "model.safetensors"]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files found")
    out: dict[str, tuple[Any, str, tuple[int, ...]]] = {}
    for f in files:
        if not f.exists():
            raise CheckpointError(f"{f}: listed in model.safetensors.index.json but missing")
        handle = _open_safetensors(f, stack)
        for name in handle.keys():
            info = handle.get_slice(name)
            if info.get_dtype() not in _DTYPES:
                raise CheckpointError(f"{f}: tensor {name!r} has unsupported dtype {info.get_dtype()!r}")
            out[name] = (handle, f.name, tuple(info.get_shape()))
    return out


def load_hf_checkpoint(path: str | os.PathLike, param_dtype: str = "float32") -> tuple[Params, ModelConfig]:
    """Read an HF checkpoint directory of a supported architecture (``SUPPORTED_ARCHS``; config.json + safetensors,
    single or sharded).

    Returns (params as NumPy float32 / bfloat16 arrays in our layout, ModelConfig). Every tensor's
    presence and shape is checked; errors name the tensor and the expected vs found shape.
    """
    path = Path(path)
    hf_cfg, cfg = read_hf_config(path, param_dtype)
    with contextlib.ExitStack() as stack:
        return _load_params(path, hf_cfg, cfg, _collect_tensors(path, stack)), cfg


def read_hf_config(path: str | os.PathLike, param_dtype: str = "float32") -> tuple[dict[str, Any], ModelConfig]:
    """(config.json as a dict, the ModelConfig it describes with ``param_dtype``) of an HF checkpoint directory;
    no tensor is read."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{path}: config.json not found")
    try:
        hf_cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file}: invalid JSON ({e})") from e
    return hf_cfg, dataclasses.replace(config_from_hf(hf_cfg, str(cfg_file)), param_dtype=param_dtype)


def _load_params(path: Path, hf_cfg: dict[str, Any], cfg: ModelConfig, tensors: dict) -> Params:
    """Fill preallocated params tensor by tensor: each HF tensor is read when needed, converted into its
    slot and dropped, so no more than one source tensor is alive at a time."""
    np_dt = np.dtype(to_dtype(cfg.param_dtype))

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise CheckpointError(f"{path}: tensor {name!r} is missing (expected shape {list(shape)})")
        handle, fname, found = tensors[name]
        if found != tuple(shape):
            raise CheckpointError(f"{path}/{fname}: tensor {name!r} has shape {list(found)}, expected {list(shape)}")
        try:
            return handle.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{path}/{fname}: tensor {name!r} is unreadable ({e})") from e

    shapes = param_shapes(cfg)
    prefix = hf_llama4.text_config(hf_cfg)[1] if cfg.arch == "llama4" else ""
    params: Params = {
        "embed": np.asarray(get(prefix + "model.embed_tokens.weight", shapes["embed"]), np_dt),
        "final_norm": np.asarray(get(prefix + "model.norm.weight", shapes["final_norm"]), np_dt),
        "layers": {},
    }
    if not cfg.tie_embeddings:
        v, d = shapes["lm_head"][1], shapes["lm_head"][0]
        params["lm_head"] = np.asarray(get(prefix + "lm_head.weight", (v, d)).T, np_dt)
    if cfg.arch == "llama4":
        params.update(hf_llama4.load_layers(get, cfg, shapes, np_dt, prefix, _from_hf_layout, _hf_layer_shape))
        return params
    for key, suffix in layer_map(cfg):
        full = shapes["layers"][key]
        per = full[1:]
        stacked = np.empty(full, np_dt)
        for i in range(cfg.n_layers):
            w = get(f"model.layers.{i}.{suffix}", _hf_layer_shape(key, per))
            stacked[i] = _from_hf_layout(key, np.asarray(w, np.float32), per)  # the assignment casts to np_dt
        params["layers"][key] = stacked
    if cfg.is_moe:
        params.update(hf_qwen.load_moe_layers(get, cfg, shapes, np_dt))
    return params


def hf_state_dict(params: Params, cfg: ModelConfig, dtype: str = "float32") -> dict[str, np.ndarray]:
    """Our params -> HF tensor names and torch layouts (C-contiguous NumPy, ``dtype``)."""
    np_dt = np.dtype(to_dtype(dtype))
    host = jax.tree.map(lambda a: np.asarray(jax.device_get(a)), params)
    sd = {"model.embed_tokens.weight": host["embed"].astype(np_dt)}
    if cfg.arch == "llama4":
        sd.update(hf_llama4.layer_state_dict(host, cfg, np_dt, _to_hf_layout))
    else:
        for i in range(cfg.n_layers):
            for key, suffix in layer_map(cfg):
                sd[f"model.layers.{i}.{suffix}"] = _to_hf_layout(key, host["layers"][key][i]).astype(np_dt, order="C")
        if cfg.is_moe:
            sd.update(hf_qwen.moe_state_dict(host, cfg, np_dt))
    sd["model.norm.weight"] = host["final_norm"].astype(np_dt)
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = host["lm_head"].T.astype(np_dt, order="C")
    return sd


def save_hf_checkpoint(
    params: Params, cfg: ModelConfig, path: str | os.PathLike, *, dtype: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> None:
    """Write ``params`` as an HF directory of ``cfg.arch``'s own architecture (``LlamaForCausalLM``,
    ``Qwen2ForCausalLM``, ...) that transformers and SGLang load.

    ``dtype`` defaults to the params' storage dtype. Shards above ``max_shard_bytes`` are split with a
    ``model.safetensors.index.json``. Files are written to temporary names and renamed into place, so a
    reader never sees a half-written tensor file.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = dtype or cfg.param_dtype
    sd = hf_state_dict(params, cfg, dtype)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, a in sd.items():
        if shards[-1] and size + a.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = a
        size += a.nbytes
    for stale in list(path.glob("model*.safetensors")) + list(path.glob("model.safetensors.index.json")):
        stale.unlink()
    if len(shards) == 1:
        write_safetensors(shards[0], path / "model.safetensors")
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(shard, path / fname)
            weight_map.update({n: fname for n in shard})
        total = sum(a.nbytes for a in sd.values())
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    hf_cfg = config_to_hf(cfg, dtype)
    (path / "config.json").write_text(json.dumps(hf_cfg, indent=2))
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
