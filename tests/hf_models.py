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


def make_hf_llama4(path: Path, *, vocab=97, hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, expert_ffn=48,
                   dense_ffn=80, experts=4, top_k=1, moe_step=2, nope_interval=2, chunk=4, qk_norm=True,
                   temp_tuning=True, floor_scale=4, llama3_rope=True, seed=0, init_std=0.02):
    """Save a random text-only Llama4ForCausalLM (float32) to ``path`` and return the torch model (eager
    attention). Defaults exercise every Llama-4 feature on a short sequence: interleaved MoE layers, NoPE
    layers, chunked attention shorter than the test sequence, QK norm and temperature tuning that changes
    within it (a small ``floor_scale``)."""
    import torch
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 500000.0}
    if llama3_rope:
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    cfg = Llama4TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=expert_ffn, intermediate_size_mlp=dense_ffn,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        num_local_experts=experts, num_experts_per_tok=top_k, interleave_moe_layer_step=moe_step,
        no_rope_layer_interval=nope_interval, attention_chunk_size=chunk, use_qk_norm=qk_norm,
        attn_temperature_tuning=temp_tuning, floor_scale=floor_scale, attn_scale=0.1, rope_parameters=rope,
        max_position_embeddings=256, initializer_range=init_std, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    model = Llama4ForCausalLM(cfg).eval().float()
    with torch.no_grad():  # HF initialises the router and norms to near-constant values: randomise them so
        for name, p in model.named_parameters():  # routing differs across tokens and norms matter
            if "router" in name:
                p.normal_(0.0, 1.0)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return model


def make_hf_qwen(path: Path, arch: str, *, vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=None,
                 ffn=96, tied=False, theta=1_000_000.0, experts=8, top_k=2, expert_ffn=32, sparse_step=1,
                 mlp_only=(), norm_topk=True, seed=0, init_std=0.02):
    """Save a random ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` (``arch``: "qwen2",
    "qwen3", "qwen3_moe"; float32, eager attention) to ``path`` and return the torch model. HF initialises biases
    to 0, norm gains to 1 and (Qwen3-MoE) the router near 0: they are randomised so that each matters (biases and
    q/k norms change the logits, the router sends tokens to different experts with unequal weights)."""
    import torch
    from transformers import (
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=ffn, tie_word_embeddings=tied,
                  rope_parameters={"rope_type": "default", "rope_theta": theta}, max_position_embeddings=256,
                  initializer_range=init_std, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "qwen2":
        cfg, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg, cls = Qwen3Config(head_dim=head_dim or hidden // heads, **common), Qwen3ForCausalLM
    else:
        cfg = Qwen3MoeConfig(head_dim=head_dim or hidden // heads, num_experts=experts, num_experts_per_tok=top_k,
                             moe_intermediate_size=expert_ffn, decoder_sparse_step=sparse_step,
                             mlp_only_layers=list(mlp_only), norm_topk_prob=norm_topk, **common)
        cls = Qwen3MoeForCausalLM
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval().float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)
    model.save_pretrained(path)
    return model


#: A chat template in the shape of Qwen3's (ChatML turns, ``<think>`` blocks, ``enable_thinking``), written for the
#: tests: each message as ``<|im_start|>role\ncontent<|im_end|>\n``, then the assistant header; with
#: ``enable_thinking=false`` an empty think block, as Qwen3's template does to switch thinking off.
QWEN_CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")


def make_qwen_tokenizer(path: Path, texts, *, vocab_size=400):
    """A byte-level BPE trained on ``texts`` carrying Qwen's special tokens (``<|endoftext|>`` pad, ``<|im_end|>``
    eos, ``<|im_start|>``, ``<think>``, ``</think>``; no bos, as Qwen) and :data:`QWEN_CHAT_TEMPLATE`, saved as a
    tokenizer directory. Returns the number of ids."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(QWEN_SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "model_max_length": 4096, "clean_up_tokenization_spaces": False,
        "chat_template": QWEN_CHAT_TEMPLATE}, indent=2))
    return tok.get_vocab_size()
