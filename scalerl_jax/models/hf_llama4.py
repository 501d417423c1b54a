"""HF Llama-4 text checkpoints (``Llama4ForCausalLM``, or the text half of ``Llama4ForConditionalGeneration``)
<-> our ``arch="llama4"`` params. File I/O (the ``safetensors`` library), sharding and error handling are
:mod:`hf_io`'s; ``load_layers`` fills preallocated arrays one lazily read HF tensor at a time.

HF layout per layer ``i`` (prefix ``model.layers.{i}.``): the attention and norms as in Llama; a dense layer's
``feed_forward.{gate,up,down}_proj.weight``; an MoE layer's ``feed_forward.router.weight`` [E, D],
``feed_forward.experts.gate_up_proj`` [E, D, 2Fe] (gate then up, already [in, out]),
``feed_forward.experts.down_proj`` [E, Fe, D] and ``feed_forward.shared_expert.{gate,up,down}_proj.weight``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.hf_rope import rope_from_hf, rope_to_hf

ARCHS = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")
_ATTN = [("attn_norm", "input_layernorm.weight"), ("wq", "self_attn.q_proj.weight"),
         ("wk", "self_attn.k_proj.weight"), ("wv", "self_attn.v_proj.weight"), ("wo", "self_attn.o_proj.weight"),
         ("mlp_norm", "post_attention_layernorm.weight")]
_DENSE = [("w_gate", "feed_forward.gate_proj.weight"), ("w_up", "feed_forward.up_proj.weight"),
          ("w_down", "feed_forward.down_proj.weight")]
_SHARED = [("shared_gate", "feed_forward.shared_expert.gate_proj.weight"),
           ("shared_up", "feed_forward.shared_expert.up_proj.weight"),
           ("shared_down", "feed_forward.shared_expert.down_proj.weight")]


def is_llama4(hf: dict[str, Any]) -> bool:
    archs = hf.get("architectures") or []
    return any(a in ARCHS for a in archs) or hf.get("model_type") in ("llama4", "llama4_text")


def text_config(hf: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(the text config dict, the tensor-name prefix) of a Llama-4 config.json."""
    if "text_config" in hf:  # multimodal checkpoint: the language model lives under language_model.
        return hf["text_config"], "language_model."
    return hf, ""


def _interval(flags: list[int], want: int, field: str, source: str, err) -> int:
    """The k such that flags[i] == want exactly when (i + 1) % k == 0 (0 when ``want`` never occurs)."""
    hits = [i for i, f in enumerate(flags) if int(f) == want]
    if not hits:
        return 0
    k = hits[0] + 1
    expected = [i for i in range(len(flags)) if (i + 1) % k == 0]
    if hits != expected:
        raise err(f"{source}: field {field!r} = {flags} is not periodic (every {k}-th layer); only periodic "
                  f"patterns are supported")
    return k


def config_from_hf(hf_all: dict[str, Any], source: str, err: Callable[[str], Exception]) -> ModelConfig:
    hf, _ = text_config(hf_all)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "num_local_experts"):
        if key not in hf:
            raise err(f"{source}: required field {key!r} is missing")
    if hf.get("attention_bias"):
        raise err(f"{source}: field 'attention_bias' expected false (biases unsupported), found true")
    if hf.get("hidden_act", "silu") != "silu":
        raise err(f"{source}: field 'hidden_act' expected 'silu', found {hf['hidden_act']!r}")
    L = int(hf["num_hidden_layers"])
    theta, scaling = rope_from_hf(hf, source, err, default_theta=500000.0)
    no_rope = hf.get("no_rope_layers")
    interval = int(hf.get("no_rope_layer_interval", 4))
    nope_every = _interval(list(no_rope), 0, "no_rope_layers", source, err) if no_rope else interval
    moe_layers = hf.get("moe_layers")
    step = int(hf.get("interleave_moe_layer_step", 1))
    if moe_layers is not None:
        flags = [int(i in set(moe_layers)) for i in range(L)]
        step = _interval(flags, 1, "moe_layers", source, err)
        if step == 0:
            raise err(f"{source}: field 'moe_layers' is empty; a model without MoE layers is a dense Llama")
    n_heads = hf["num_attention_heads"]
    dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    eos = hf.get("eos_token_id")
    return ModelConfig(
        arch="llama4", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=L, n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        ffn_dim=int(hf.get("intermediate_size_mlp", 16384)), expert_ffn_dim=int(hf["intermediate_size"]),
        n_experts=int(hf["num_local_experts"]), top_k=int(hf.get("num_experts_per_tok", 1)), moe_every=step,
        nope_every=nope_every, local_attn_chunk=hf.get("attention_chunk_size"),
        qk_norm=bool(hf.get("use_qk_norm", True)), attn_temp_tuning=bool(hf.get("attn_temperature_tuning", True)),
        attn_floor_scale=int(hf.get("floor_scale", 8192)), attn_scale=float(hf.get("attn_scale", 0.1)),
        rope_theta=float(theta), rope_scaling=scaling, rms_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=int(hf.get("max_position_embeddings", 131072)),
        dtype="bfloat16" if dtype == "bfloat16" else "float32", param_dtype="float32",
        bos_token_id=hf.get("bos_token_id"), eos_token_id=eos[0] if isinstance(eos, list) else eos,
        pad_token_id=hf.get("pad_token_id"),
    )


def config_to_hf(cfg: ModelConfig, dtype: str) -> dict[str, Any]:
    rope, _ = rope_to_hf(cfg.rope_theta, cfg.rope_scaling)
    L = cfg.n_layers
    no_rope = [int(cfg.uses_rope(i)) for i in range(L)]
    return {
        "architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "num_hidden_layers": L, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "intermediate_size": cfg.expert_ffn_dim,
        "intermediate_size_mlp": cfg.ffn_dim, "num_local_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k, "interleave_moe_layer_step": cfg.moe_every,
        "moe_layers": [i for i in range(L) if cfg.is_moe_layer(i)],
        "no_rope_layer_interval": cfg.nope_every or L + 1, "no_rope_layers": no_rope,
        "attention_chunk_size": cfg.local_attn_chunk,
        "layer_types": ["chunked_attention" if r and cfg.local_attn_chunk else "full_attention" for r in no_rope],
        "use_qk_norm": cfg.qk_norm, "attn_temperature_tuning": cfg.attn_temp_tuning,
        "floor_scale": cfg.attn_floor_scale, "attn_scale": cfg.attn_scale, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_eps, "rope_parameters": rope, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_seq_len, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
        "torch_dtype": dtype, "dtype": dtype, "use_cache": True,
    }


def load_layers(get: Callable, cfg: ModelConfig, shapes: dict, np_dt, prefix: str,
                to_ours: Callable, hf_shape: Callable) -> dict[str, dict[str, np.ndarray]]:
    """Fill ``layers``/``dense``/``moe`` from HF tensors; ``get(name, shape)`` checks presence and shape."""
    out: dict[str, dict[str, np.ndarray]] = {g: {k: np.empty(s, np_dt) for k, s in shapes[g].items()}
                                             for g in ("layers", "dense", "moe") if g in shapes}
    D, E, Fe = cfg.d_model, cfg.n_experts, cfg.expert_ffn_dim
    i_dense = i_moe = 0
    for i in range(cfg.n_layers):
        base = f"{prefix}model.layers.{i}."
        for key, suffix in _ATTN:
            per = shapes["layers"][key][1:]
            out["layers"][key][i] = to_ours(key, np.asarray(get(base + suffix, hf_shape(key, per)), np.float32), per)
        if cfg.is_moe_layer(i):
            m = out["moe"]
            m["router"][i_moe] = np.asarray(get(base + "feed_forward.router.weight", (E, D)), np.float32).T
            gu = np.asarray(get(base + "feed_forward.experts.gate_up_proj", (E, D, 2 * Fe)), np.float32)
            m["w_gate"][i_moe], m["w_up"][i_moe] = gu[..., :Fe], gu[..., Fe:]
            m["w_down"][i_moe] = np.asarray(get(base + "feed_forward.experts.down_proj", (E, Fe, D)), np.float32)
            for key, suffix in _SHARED:
                per = shapes["moe"][key][1:]
                m[key][i_moe] = np.asarray(get(base + suffix, per[::-1]), np.float32).T
            i_moe += 1
        else:
            for key, suffix in _DENSE:
                per = shapes["dense"][key][1:]
                out["dense"][key][i_dense] = np.asarray(get(base + suffix, per[::-1]), np.float32).T
            i_dense += 1
    return out


def layer_state_dict(host: dict, cfg: ModelConfig, np_dt, to_hf: Callable) -> dict[str, np.ndarray]:
    sd: dict[str, np.ndarray] = {}
    i_dense = i_moe = 0
    for i in range(cfg.n_layers):
        base = f"model.layers.{i}."
        for key, suffix in _ATTN:
            sd[base + suffix] = to_hf(key, host["layers"][key][i]).astype(np_dt, order="C")
        if cfg.is_moe_layer(i):
            m = host["moe"]
            sd[base + "feed_forward.router.weight"] = m["router"][i_moe].T.astype(np_dt, order="C")
            sd[base + "feed_forward.experts.gate_up_proj"] = np.concatenate(
                [m["w_gate"][i_moe], m["w_up"][i_moe]], axis=-1).astype(np_dt)
            sd[base + "feed_forward.experts.down_proj"] = m["w_down"][i_moe].astype(np_dt)
            for key, suffix in _SHARED:
                sd[base + suffix] = m[key][i_moe].T.astype(np_dt, order="C")
            i_moe += 1
        else:
            for key, suffix in _DENSE:
                sd[base + suffix] = host["dense"][key][i_dense].T.astype(np_dt, order="C")
            i_dense += 1
    return sd
