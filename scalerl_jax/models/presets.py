"""Model presets: the tiny CPU default, a ~100M benchmark model and Llama-3.1-8B shapes."""

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


PRESETS = {"tiny": tiny, "llama_100m": llama_100m, "llama3_8b": llama3_8b, "8b": llama3_8b}


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
