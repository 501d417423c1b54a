"""The train state born sharded: no leaf of the params, the Adam moments or the step ever exists whole on one
device, in one process or many.

1. Params are placed on the mesh as they are read (:func:`place_params`): from an HF checkpoint directory each
   process reads only its devices' blocks (:func:`~scalerl_jax.models.hf_sharded.load_hf_sharded`); a host
   pytree (tests, a warm start held in memory) is cut into the same blocks with ``make_array_from_callback``.
2. The optimiser state is created by one jitted computation (:func:`init_state_fn`) whose output shardings are
   the state's planned shardings and whose params argument is donated, so each device allocates only its own
   blocks of the moments and the params pass through without a copy.

``python -m scalerl_jax.aot`` compiles the same :func:`init_state_fn` on the preset's mesh and reports its peak
per-device memory beside the train step's (``init_peak_gib_per_device``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from scalerl_jax.config import ModelConfig
from scalerl_jax.train.step import TrainState, init_train_state


def place_params(source: Any, cfg: ModelConfig, shardings: Any, *, stats=None) -> Any:
    """Params on their planned shardings. ``source``: an HF checkpoint directory (str / path; read per shard,
    ``stats`` counts the bytes this process read) or a pytree of arrays (host or device) of ``cfg``'s shapes."""
    if isinstance(source, (str, os.PathLike)):
        from scalerl_jax.models.hf_sharded import load_hf_sharded

        return load_hf_sharded(Path(source), cfg, shardings, stats=stats)
    dt = np.dtype(jax.numpy.dtype(cfg.param_dtype))

    def put(x, sharding):
        if isinstance(x, jax.Array) and x.sharding == sharding and x.dtype == dt:
            return x.copy()  # the init donates its argument: the caller's array must survive it
        host = np.asarray(jax.device_get(x) if isinstance(x, jax.Array) else x)
        if host.dtype != dt:
            host = host.astype(dt)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

    return jax.tree.map(put, source, shardings)


def init_state_fn(optimizer: optax.GradientTransformation, state_sh: TrainState):
    """``jit(params -> TrainState)`` with ``out_shardings`` = the state's shardings and the params donated."""
    return jax.jit(lambda params: init_train_state(params, optimizer), in_shardings=(state_sh.params,),
                   out_shardings=state_sh, donate_argnums=(0,))


def init_sharded_state(source: Any, cfg: ModelConfig, optimizer: optax.GradientTransformation,
                       state_sh: TrainState, *, stats=None) -> TrainState:
    """The initial train state of ``source``'s weights (see :func:`place_params`), sharded from birth."""
    params = place_params(source, cfg, state_sh.params, stats=stats)
    return init_state_fn(optimizer, state_sh)(params)
