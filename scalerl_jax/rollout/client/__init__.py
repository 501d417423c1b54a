"""The trainer's side of a generation fleet: :class:`SGLangGenerator` (``sglang.py``) talks SGLang's native HTTP
API to real SGLang servers, ours, or an ``sglang-router`` (retries, failover, client-side interruption), with the
request bodies and response reading of every release in ``wire.py`` and the in-flight weight updates in
``weights.py``; :class:`RemoteGenerator` (``remote.py``) takes params like the embedded engine, writes them as an HF
checkpoint and pushes it to the fleet. Nothing here imports JAX.
"""

from scalerl_jax.rollout.client.remote import RemoteGenerator
from scalerl_jax.rollout.client.sglang import SGLangGenerator
from scalerl_jax.rollout.client.weights import GenerationError, WeightVersionMismatch

__all__ = ["GenerationError", "RemoteGenerator", "SGLangGenerator", "WeightVersionMismatch"]
