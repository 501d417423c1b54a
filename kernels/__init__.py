"""Hand-written Pallas kernels, each beside a pure-JAX reference it is tested against (interpret mode on CPU).

- :mod:`kernels.token_logprobs`: fused LM-head token log-probs and entropies (reference:
  :func:`scalerl_jax.losses.logprobs.token_logprobs`), selected by ``ModelConfig.logprobs_impl="pallas"``.
"""
