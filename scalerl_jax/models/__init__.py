"""Models: the dense Llama and Llama-4 decoders behind one API (:mod:`.model`), presets and HF checkpoint I/O."""

from scalerl_jax.models.hf_io import CheckpointError, load_hf_checkpoint, save_hf_checkpoint
from scalerl_jax.models.model import (
    abstract_params,
    forward,
    forward_cached,
    forward_hidden,
    head_weight,
    init_cache,
    init_params,
    lm_logits,
    param_axes,
    param_shapes,
    param_specs,
)
from scalerl_jax.models.presets import get_preset, llama3_1b, llama3_8b, llama_100m, scout_17b16e, tiny, tiny_moe

__all__ = [
    "CheckpointError", "abstract_params", "forward", "forward_cached", "forward_hidden", "get_preset",
    "head_weight", "init_cache", "init_params", "llama3_1b", "llama3_8b", "llama_100m", "lm_logits",
    "load_hf_checkpoint", "param_axes", "param_shapes", "param_specs", "save_hf_checkpoint", "scout_17b16e", "tiny",
    "tiny_moe",
]
