"""Kernels, each beside a pure-JAX reference it is tested against (Pallas in interpret mode on CPU): library kernels
where they exist, hand-written Pallas only where none does.

- :mod:`kernels.token_logprobs`: fused LM-head token log-probs and entropies (reference:
  :func:`scalerl_jax.losses.logprobs.token_logprobs`), selected by ``ModelConfig.logprobs_impl="pallas"``.
- :mod:`kernels.attention`: causal GQA attention (Llama-4 local chunks included) through cuDNN
  (``jax.nn.dot_product_attention``) or JAX's Pallas GPU ops (``mha``, ``decode_attention``), selected by
  ``ModelConfig.attention_impl`` (reference: :func:`scalerl_jax.models.layers.attention`).
"""
