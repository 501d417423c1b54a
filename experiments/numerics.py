"""What a preset decides about a model whatever checkpoint it starts from: how to compute, not what the model is.

Kept apart from :mod:`experiments.run_path` (which re-exports both names) so that code needing only this, such as
the kernel tests the GPU check runs on an image without the run path's dependencies, imports nothing else.
"""

from __future__ import annotations

import dataclasses

from scalerl_jax.config import ModelConfig

# ModelConfig fields a preset decides whatever checkpoint it starts from (how to compute, not what the model is)
NUMERICS = ("dtype", "param_dtype", "head_dtype", "remat", "attn_chunk", "moe_impl", "moe_capacity_factor",
            "attention_impl", "head_matmul_impl")


def model_from_checkpoint(preset: ModelConfig, ckpt: ModelConfig) -> ModelConfig:
    """The checkpoint's architecture with the preset's numerics (``NUMERICS``)."""
    return dataclasses.replace(ckpt, **{f: getattr(preset, f) for f in NUMERICS})
