"""Model presets: the tiny CPU default, a ~100M benchmark model, Llama-3.2-1B and Llama-3.1-8B shapes, the
Llama-4 MoE pair (``tiny_moe`` for CPU, ``scout_17b16e``), and the Qwen models RL runs start from (Qwen2.5-1.5B,
Qwen3-4B, Qwen3-30B-A3B). Shapes are those of each model's published ``config.json``; ``--model DIR`` reads them
from the checkpoint itself, so a preset only matters for ``--dry-run`` and for random-init runs."""

from __future__ import annotations

from scalerl_jax.config import ModelConfig, RopeScaling


def tiny() -> ModelConfig:
    """~0.8M parameters over the 17-token character vocabulary of the synthetic arithmetic task."""
    return ModelConfig(
        vocab_size=17, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=512,
        rope_theta=10000.0, rope_scaling=None, rms_eps=1e-5, tie_embeddings=False, max_seq_len=64,
        dtype="float32", param_dtype="float32", head_dtype="float32", remat=False, attn_chunk=64,
        bos_token_id=None, eos_token_id=1, pad_token_id=0,
    )


def llama_100m() -> ModelConfig:
    """~124M parameters, Llama-shaped (benchmarks on CPU)."""
    return ModelConfig(
        vocab_size=32000, d_model=768, n_layers=12, n_heads=12, n_kv_heads=4, head_dim=64, ffn_dim=2048,
        rope_theta=500000.0, rope_scaling=RopeScaling(), max_seq_len=2048, dtype="float32",
        param_dtype="float32", remat=False, attn_chunk=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def llama3_1b() -> ModelConfig:
    """Llama-3.2-1B shapes: 16 layers, d 2048, FFN 8192, 32/8 heads of 64, vocab 128256, tied embeddings, llama3
    RoPE (factor 32). ~1.24B parameters (the GPU check's train-step MFU and decode model)."""
    return ModelConfig(
        vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ffn_dim=8192,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192),
        rms_eps=1e-5, tie_embeddings=True, max_seq_len=131072, dtype="bfloat16", param_dtype="float32",
        head_dtype="float32", remat=True, attn_chunk=1024, bos_token_id=128000, eos_token_id=128001,
        pad_token_id=None,
    )


def llama3_8b() -> ModelConfig:
    """Llama-3.1-8B shapes: 32 layers, d 4096, FFN 14336, 32/8 heads, vocab 128256, llama3 RoPE."""
    return ModelConfig(
        vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ffn_dim=14336,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192),
        rms_eps=1e-5, tie_embeddings=False, max_seq_len=131072, dtype="bfloat16", param_dtype="float32",
        head_dtype="float32", remat=True, attn_chunk=1024, bos_token_id=128000, eos_token_id=128001,
        pad_token_id=None,
    )


def tiny_moe() -> ModelConfig:
    """The tiny model as a Llama-4 MoE: 4 experts (top-1) + a shared expert on layers 1 and 3, dense SwiGLU on 0
    and 2, layer 3 NoPE (global attention, temperature tuning), RoPE layers chunked to 32 positions with QK norm.
    ~1.4M parameters in total, ~0.9M active per token."""
    return ModelConfig(
        arch="llama4", vocab_size=17, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=512,
        n_experts=4, top_k=1, expert_ffn_dim=256, moe_every=2, nope_every=4, local_attn_chunk=32, qk_norm=True,
        attn_temp_tuning=True, attn_floor_scale=16, attn_scale=0.1, rope_theta=10000.0, rope_scaling=None,
        rms_eps=1e-5, tie_embeddings=False, max_seq_len=64, dtype="float32", param_dtype="float32",
        head_dtype="float32", remat=False, attn_chunk=64, bos_token_id=None, eos_token_id=1, pad_token_id=0,
    )


def scout_17b16e() -> ModelConfig:
    """Llama-4-Scout-17B-16E text shapes (HF ``meta-llama/Llama-4-Scout-17B-16E`` text_config): 48 layers, all
    MoE (16 routed experts, top-1, + shared), d 5120, 40 / 8 heads of 128, expert FFN 8192, dense FFN 16384
    (unused: every layer is MoE), vocab 202048, every 4th layer NoPE, 8192-token chunked attention on the RoPE
    layers, QK norm, temperature tuning, llama3 RoPE (factor 16). ~108B parameters, ~17B active per token.

    Expert parallelism uses a capacity factor of 2 (each shard sends at most twice its average per-destination
    load to any expert shard; overflow is dropped and reported as ``router_dropped_frac``): the dropless
    fixed-size all-to-all buffers (16x the tokens) do not fit 16 GB200s at 16k tokens (AOT: 179 GiB per device
    against 131 GiB with the factor). Set ``moe_capacity_factor=None`` for dropless on more devices."""
    return ModelConfig(
        arch="llama4", vocab_size=202048, d_model=5120, n_layers=48, n_heads=40, n_kv_heads=8, head_dim=128,
        ffn_dim=16384, n_experts=16, top_k=1, expert_ffn_dim=8192, moe_every=1, nope_every=4,
        local_attn_chunk=8192, qk_norm=True, attn_temp_tuning=True, attn_floor_scale=8192, attn_scale=0.1,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                                 original_max_position_embeddings=8192),
        rms_eps=1e-5, tie_embeddings=False, max_seq_len=10485760, dtype="bfloat16", param_dtype="float32",
        head_dtype="float32", remat=True, attn_chunk=1024, bos_token_id=200000, eos_token_id=200001,
        pad_token_id=200018, moe_capacity_factor=2.0,
    )


def qwen25_1_5b() -> ModelConfig:
    """Qwen2.5-1.5B shapes (``Qwen2ForCausalLM``): 28 layers, d 1536, FFN 8960, 12 / 2 heads of 128 with q/k/v
    biases, vocab 151936 (151,665 tokens, the rest padding), tied embeddings, RoPE theta 1e6, RMS eps 1e-6. ~1.54B
    parameters. DeepSeek-R1-Distill-Qwen-1.5B (DeepScaleR's base) has the same layers with an untied head and theta
    1e4; its checkpoint brings those with ``--model``."""
    return ModelConfig(
        arch="qwen2", vocab_size=151936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2, head_dim=128,
        ffn_dim=8960, rope_theta=1000000.0, rope_scaling=None, rms_eps=1e-6, tie_embeddings=True,
        max_seq_len=32768, dtype="bfloat16", param_dtype="float32", head_dtype="float32", remat=True,
        attn_chunk=1024, bos_token_id=None, eos_token_id=151643, pad_token_id=151643,
    )


def qwen3_4b() -> ModelConfig:
    """Qwen3-4B shapes (``Qwen3ForCausalLM``): 36 layers, d 2560, FFN 9728, 32 / 8 heads of 128 (head_dim 128, not
    2560 / 32 = 80) with per-head q/k RMSNorm, vocab 151936, tied embeddings, RoPE theta 1e6, RMS eps 1e-6,
    ``<|im_end|>`` (151645) ends a turn. ~4.02B parameters."""
    return ModelConfig(
        arch="qwen3", vocab_size=151936, d_model=2560, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
        ffn_dim=9728, rope_theta=1000000.0, rope_scaling=None, rms_eps=1e-6, tie_embeddings=True,
        max_seq_len=40960, dtype="bfloat16", param_dtype="float32", head_dtype="float32", remat=True,
        attn_chunk=1024, bos_token_id=None, eos_token_id=151645, pad_token_id=151643,
    )


def qwen3_30b_a3b() -> ModelConfig:
    """Qwen3-30B-A3B shapes (``Qwen3MoeForCausalLM``): 48 layers, every one sparse (128 experts of width 768, top-8
    of the softmax, renormalised: ``norm_topk_prob``), d 2048, 32 / 4 heads of 128 with per-head q/k RMSNorm, vocab
    151936, untied head, RoPE theta 1e6. ~30.5B parameters, ~3.3B active per token. Dropless expert parallelism
    (``moe_capacity_factor=None``): with top-8 over 128 experts each shard's load is spread over many destinations,
    and the dry runs say whether the worst-case buffers fit."""
    return ModelConfig(
        arch="qwen3_moe", vocab_size=151936, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128,
        ffn_dim=6144, n_experts=128, top_k=8, expert_ffn_dim=768, moe_every=1, norm_topk_prob=True,
        rope_theta=1000000.0, rope_scaling=None, rms_eps=1e-6, tie_embeddings=False, max_seq_len=40960,
        dtype="bfloat16", param_dtype="float32", head_dtype="float32", remat=True, attn_chunk=1024,
        bos_token_id=None, eos_token_id=151645, pad_token_id=151643,
    )


PRESETS = {"tiny": tiny, "llama_100m": llama_100m, "llama3_1b": llama3_1b, "llama3_8b": llama3_8b, "8b": llama3_8b,
           "tiny_moe": tiny_moe, "scout_17b16e": scout_17b16e, "scout": scout_17b16e, "qwen25_1_5b": qwen25_1_5b,
           "qwen3_4b": qwen3_4b, "qwen3_30b_a3b": qwen3_30b_a3b}


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
