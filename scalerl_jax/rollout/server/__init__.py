"""Our SGLang-API HTTP server over the embedded engine: :func:`create_app` (``app.py``) builds the FastAPI app (the
routes of SGLang's native API that RL trainers use, plus our extensions) from a
:class:`~scalerl_jax.rollout.engine.JaxEngine` and a :class:`ServerInfo`; ``wire.py`` parses SGLang's request
bodies and builds its responses. ``python -m scalerl_jax.serve`` starts one.
"""

from scalerl_jax.rollout.server.app import ServerInfo, create_app

__all__ = ["ServerInfo", "create_app"]
