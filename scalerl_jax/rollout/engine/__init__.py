"""The embedded JAX generation engine: :class:`JaxEngine` (``scheduler.py``) batches requests continuously over
row slots of one KV cache and swaps weights in flight; ``decode.py`` holds its jitted prefill and decode chunk
(the interruption state machine), ``rows.py`` its submissions, rows and per-slot host arrays, ``sampling.py`` the
token sampler, and ``driver.py`` :class:`EngineDriver`, the thread that steps the scheduler for a server, with
pause and continue. The trainer's in-process path calls :meth:`JaxEngine.generate` directly.
"""

from scalerl_jax.rollout.engine.driver import EngineDriver
from scalerl_jax.rollout.engine.scheduler import JaxEngine

__all__ = ["EngineDriver", "JaxEngine"]
