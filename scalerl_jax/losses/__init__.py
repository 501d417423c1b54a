"""Policy losses, advantages and FP32 chunked token log-probs (RECIPE.md section 2)."""

from scalerl_jax.losses.advantages import compute_advantages
from scalerl_jax.losses.logprobs import token_logprobs, token_logprobs_naive
from scalerl_jax.losses.policy import aggregation_weights, policy_loss

__all__ = ["aggregation_weights", "compute_advantages", "policy_loss", "token_logprobs", "token_logprobs_naive"]
