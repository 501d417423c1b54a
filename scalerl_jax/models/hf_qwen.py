"""HF Qwen checkpoints: ``Qwen2ForCausalLM`` (Qwen2 / Qwen2.5, DeepSeek-R1-Distill-Qwen), ``Qwen3ForCausalLM`` and
``Qwen3MoeForCausalLM`` <-> our ``arch="qwen2" | "qwen3" | "qwen3_moe"`` params. File I/O, sharding, the config
fields Qwen shares with Llama and error handling are :mod:`hf_io`'s; this module holds what is Qwen's own.

HF layout per layer ``i`` (prefix ``model.layers.{i}.``): the Llama attention and norms, plus Qwen2's
``self_attn.{q,k,v}_proj.bias`` [H*Dh] / [K*Dh] and Qwen3's ``self_attn.{q,k}_norm.weight`` [Dh]. A Qwen3-MoE
sparse layer has ``mlp.gate.weight`` [E, D] (the router) and, per expert ``j``,
``mlp.experts.{j}.{gate,up,down}_proj.weight`` (torch ``Linear`` layouts; the layout of the published checkpoints
and the one SGLang loads; transformers 5 fuses them on load); a dense layer (``mlp_only_layers``, or off the
``decoder_sparse_step`` pattern) has ``mlp.{gate,up,down}_proj.weight`` of width ``intermediate_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from scalerl_jax.config import ModelConfig

#: HF ``architectures`` / ``model_type`` -> our ``ModelConfig.arch`` (Llama's included: the dense readers share it)
ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
         "Qwen3MoeForCausalLM": "qwen3_moe"}
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe"}
HF_NAMES = {ours: (hf, mt) for (hf, ours), mt in zip(ARCHS.items(), MODEL_TYPES)}

_BIAS = [("bq", "self_attn.q_proj.bias"), ("bk", "self_attn.k_proj.bias"), ("bv", "self_attn.v_proj.bias")]
_NORMS = [("q_norm", "self_attn.q_norm.weight"), ("k_norm", "self_attn.k_norm.weight")]
DENSE = [("w_gate", "mlp.gate_proj.weight"), ("w_up", "mlp.up_proj.weight"), ("w_down", "mlp.down_proj.weight")]
EXPERT = {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}


def attention_extras(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our layer key, HF suffix) of the attention tensors beyond Llama's: biases (Qwen2), q/k norms (Qwen3)."""
    return (_BIAS if cfg.qkv_bias else []) + (_NORMS if cfg.head_qk_norm else [])


def expert_name(i: int, j: int | str, key: str) -> str:
    """HF name of expert ``j``'s ``key`` (w_gate, w_up, w_down) in layer ``i`` (``j="{j}"``: a name template)."""
    return f"model.layers.{i}.mlp.experts.{j}.{EXPERT[key]}.weight"


def config_fields(hf: dict[str, Any], arch: str, source: str, err: Callable[[str], Exception]) -> dict[str, Any]:
    """The ModelConfig fields a Qwen config sets beyond Llama's (biases, norms, MoE)."""
    if hf.get("use_sliding_window"):
        raise err(f"{source}: field 'use_sliding_window' expected false (sliding-window attention unsupported), "
                  f"found true")
    if arch == "qwen2" or not hf.get("attention_bias"):
        out: dict[str, Any] = {}
    else:
        raise err(f"{source}: field 'attention_bias' expected false for {arch} (q/k/v/o biases unsupported), "
                  f"found true")
    if arch != "qwen3_moe":
        return out
    # the published configs say num_experts; transformers 5 writes its alias num_local_experts
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    if experts is None or "moe_intermediate_size" not in hf:
        raise err(f"{source}: required field {'num_experts' if experts is None else 'moe_intermediate_size'!r} is "
                  f"missing")
    L = int(hf["num_hidden_layers"])
    mlp_only = tuple(int(i) for i in hf.get("mlp_only_layers") or ())
    bad = [i for i in mlp_only if not 0 <= i < L]
    if bad:
        raise err(f"{source}: field 'mlp_only_layers' has layers {bad} outside 0..{L - 1}")
    return out | {
        "n_experts": int(experts), "top_k": int(hf.get("num_experts_per_tok", 8)),
        "expert_ffn_dim": int(hf["moe_intermediate_size"]), "moe_every": int(hf.get("decoder_sparse_step", 1)),
        "mlp_only_layers": mlp_only, "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
    }


def config_to_hf(cfg: ModelConfig, base: dict[str, Any]) -> dict[str, Any]:
    """The Llama-shaped HF config dict ``base`` rewritten as ``cfg.arch``'s own."""
    hf_arch, model_type = HF_NAMES[cfg.arch]
    out = base | {"architectures": [hf_arch], "model_type": model_type}
    if cfg.arch == "llama":
        return out
    out |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layers,
            "layer_types": ["full_attention"] * cfg.n_layers, "attention_dropout": 0.0}
    for key in ("mlp_bias", "rope_scaling"):
        out.pop(key, None)
    if cfg.arch == "qwen2":
        out.pop("attention_bias", None)
    if cfg.arch == "qwen3_moe":
        out |= {"num_experts": cfg.n_experts, "num_experts_per_tok": cfg.top_k,
                "moe_intermediate_size": cfg.expert_ffn_dim, "decoder_sparse_step": cfg.moe_every,
                "mlp_only_layers": list(cfg.mlp_only_layers), "norm_topk_prob": cfg.norm_topk_prob,
                "output_router_logits": False, "router_aux_loss_coef": 0.001}
    return out


def load_moe_layers(get: Callable, cfg: ModelConfig, shapes: dict, np_dt) -> dict[str, dict[str, np.ndarray]]:
    """Fill Qwen3-MoE's ``moe`` / ``dense`` groups from HF tensors; ``get(name, shape)`` checks presence and shape
    and reads one tensor."""
    out = {g: {k: np.empty(s, np_dt) for k, s in shapes[g].items()} for g in ("moe", "dense") if g in shapes}
    D, E, Fe = cfg.d_model, cfg.n_experts, cfg.expert_ffn_dim
    i_dense = i_moe = 0
    for i in range(cfg.n_layers):
        if cfg.is_moe_layer(i):
            m = out["moe"]
            m["router"][i_moe] = np.asarray(get(f"model.layers.{i}.mlp.gate.weight", (E, D)), np.float32).T
            for key in EXPERT:
                hf_shape = (D, Fe) if key == "w_down" else (Fe, D)
                for j in range(E):
                    m[key][i_moe, j] = np.asarray(get(expert_name(i, j, key), hf_shape), np.float32).T
            i_moe += 1
        else:
            for key, suffix in DENSE:
                per = shapes["dense"][key][1:]
                out["dense"][key][i_dense] = np.asarray(get(f"model.layers.{i}.{suffix}", per[::-1]), np.float32).T
            i_dense += 1
    return out


def moe_state_dict(host: dict, cfg: ModelConfig, np_dt) -> dict[str, np.ndarray]:
    """Qwen3-MoE's feed-forward tensors (router, per-expert and dense MLPs) in HF names and layouts."""
    sd: dict[str, np.ndarray] = {}
    i_dense = i_moe = 0
    for i in range(cfg.n_layers):
        if cfg.is_moe_layer(i):
            m = host["moe"]
            sd[f"model.layers.{i}.mlp.gate.weight"] = m["router"][i_moe].T.astype(np_dt, order="C")
            for key in EXPERT:
                for j in range(cfg.n_experts):
                    sd[expert_name(i, j, key)] = m[key][i_moe, j].T.astype(np_dt, order="C")
            i_moe += 1
        else:
            for key, suffix in DENSE:
                sd[f"model.layers.{i}.{suffix}"] = host["dense"][key][i_dense].T.astype(np_dt, order="C")
            i_dense += 1
    return sd
