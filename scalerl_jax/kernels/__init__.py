"""Kernels, each beside a pure-JAX reference it is tested against (Pallas in interpret mode on CPU): library kernels
where they exist, hand-written Pallas only where none does.

- :mod:`scalerl_jax.kernels.attention`: causal GQA attention (Llama-4 local chunks included) through cuDNN
  (``jax.nn.dot_product_attention``) or JAX's Pallas GPU ops (``mha``, ``decode_attention``), selected by
  ``ModelConfig.attention_impl`` (reference: :func:`scalerl_jax.models.layers.attention`).

The kernel tests take their ``interpret`` argument from :func:`interpret_from_env` (the ``pallas_interpret``
fixture in ``tests/conftest.py``), so the same tests run interpreted on CPU and compiled on a GPU
(``benchmarks/gpu_check.sh`` sets ``SCALERL_PALLAS_INTERPRET=0``).
"""

from __future__ import annotations

import os

INTERPRET_ENV = "SCALERL_PALLAS_INTERPRET"
_VALUES = {"": None, "auto": None, "1": True, "true": True, "0": False, "false": False}


def interpret_from_env() -> bool | None:
    """The ``interpret`` argument the kernel tests pass, from ``SCALERL_PALLAS_INTERPRET``: unset, ``""`` or
    ``auto`` -> None (interpret on CPU, compile on GPU); ``1``/``true`` -> True (always interpret); ``0``/``false``
    -> False (always compile: on a CPU backend the kernels then refuse to run, so a GPU check that silently fell
    back to CPU fails instead of passing in interpret mode)."""
    raw = os.environ.get(INTERPRET_ENV, "").strip().lower()
    if raw not in _VALUES:
        raise ValueError(f"{INTERPRET_ENV} must be one of 1, 0, true, false, auto or empty, got {raw!r}")
    return _VALUES[raw]
