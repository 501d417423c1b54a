"""RoPE fields of HF configs, shared by the Llama (:mod:`hf_io`) and Llama-4 (:mod:`hf_llama4`) converters.

transformers 5 writes ``rope_parameters`` (with ``rope_theta`` inside); transformers 4 wrote ``rope_theta`` at the
top level and the llama3 scaling in ``rope_scaling`` (``rope_type`` or the older ``type``). Both layouts are read.
:func:`rope_to_hf` returns both; the Llama writer stores both (either transformers version loads it), the Llama-4
writer only ``rope_parameters`` and the top-level ``rope_theta`` (Llama 4 is tested against transformers 5 only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scalerl_jax.config import RopeScaling


def rope_from_hf(hf: dict[str, Any], source: str, err: Callable[[str], Exception],
                 default_theta: float) -> tuple[float, RopeScaling | None]:
    """(rope_theta, llama3 scaling or None) of an HF text config; ``err`` builds the exception for a bad field."""
    rope = dict(hf.get("rope_parameters") or {})
    legacy = hf.get("rope_scaling") or {}
    src = rope if rope.get("rope_type") else legacy
    rtype = src.get("rope_type") or src.get("type") or "default"
    theta = float(rope.get("rope_theta", hf.get("rope_theta", default_theta)))
    if rtype == "default":
        return theta, None
    if rtype != "llama3":
        raise err(f"{source}: field 'rope_type' expected 'default' or 'llama3', found {rtype!r}")
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
               if k not in src]
    if missing:
        raise err(f"{source}: llama3 RoPE scaling is missing field(s) {missing}")
    return theta, RopeScaling(factor=float(src["factor"]), low_freq_factor=float(src["low_freq_factor"]),
                              high_freq_factor=float(src["high_freq_factor"]),
                              original_max_position_embeddings=int(src["original_max_position_embeddings"]))


def rope_to_hf(theta: float, scaling: RopeScaling | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(``rope_parameters``, legacy ``rope_scaling`` or None) for a config we write."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if scaling is None:
        return params, None
    legacy = {"rope_type": "llama3", "factor": scaling.factor, "low_freq_factor": scaling.low_freq_factor,
              "high_freq_factor": scaling.high_freq_factor,
              "original_max_position_embeddings": scaling.original_max_position_embeddings}
    return params | legacy, legacy
