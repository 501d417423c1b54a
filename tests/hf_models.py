"""Helpers that build random tiny HF transformers checkpoints for parity tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def make_hf_llama(path: Path, *, vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, tied=False,
                  llama3_rope=True, seed=0, init_std=0.02):
    """Save a random LlamaForCausalLM (float32) to ``path`` and return the torch model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    rope = None
    if llama3_rope:
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=ffn, rope_scaling=rope, rope_theta=500000.0,
        tie_word_embeddings=tied, max_position_embeddings=256, initializer_range=init_std,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval().float()
    model.save_pretrained(path)
    return model


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()
