"""Orbax checkpoints of a whole RL run: params, optimiser state, step, plus a JSON side car holding the
RNG, the data-iterator state, the curriculum, the compute counters and the metrics.jsonl offset.

Saves are asynchronous (the train loop only blocks for the device-to-host copy); the last
``keep`` checkpoints are kept. :meth:`RunCheckpointer.restore_latest` walks back from the newest step and
skips, with a warning, any checkpoint that fails to restore (partial or corrupt), so a run killed in the
middle of a save resumes from the previous good one.

Orbax does not checksum array data: a flipped byte in a chunk file restores silently as a wrong value. So the
side car also holds a checksum of every state leaf (computed on device at save, order-independent modular
sums of the raw bits, so sharded arrays need no gather), and a restored state whose checksums differ counts
as corrupt.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)

_CHECKSUM_KEY = "_state_checksums"
_UINT = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}


def _leaf_checksum(x: jax.Array) -> jax.Array:
    """Two uint32 sums of the leaf's raw bits, each weighted by an odd position-dependent factor: any single
    bit flip changes them, and modular addition makes the result independent of reduction order/sharding."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    bits = jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize]).astype(jnp.uint32).reshape(-1)
    i = jnp.arange(bits.size, dtype=jnp.uint32)
    w1 = i * jnp.uint32(0x9E3779B1) * jnp.uint32(2) + jnp.uint32(1)
    w2 = (i ^ jnp.uint32(0x5BD1E995)) * jnp.uint32(0x85EBCA6B) | jnp.uint32(1)
    return jnp.stack([jnp.sum(bits * w1, dtype=jnp.uint32), jnp.sum(bits * w2, dtype=jnp.uint32)])


_checksums = jax.jit(lambda tree: [_leaf_checksum(x) for x in jax.tree.leaves(tree)])


_finite = jax.jit(lambda tree: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
                                                  if jnp.issubdtype(x.dtype, jnp.floating)] or [jnp.bool_(True)])))


def all_finite(state: Any) -> bool:
    """Every floating leaf finite; computed on device, so sharded (and other processes') arrays need no gather."""
    return bool(jax.device_get(_finite(state)))


def state_checksums(state: Any) -> list[list[int]]:
    """Per-leaf checksums of a pytree of arrays (JSON-serialisable)."""
    return [[int(v) for v in np.asarray(c)] for c in jax.device_get(_checksums(state))]


class RunCheckpointer:
    def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True) -> None:
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        opts = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
        self._mgr = ocp.CheckpointManager(self.directory, options=opts, item_names=("state", "extras"))
        self.last_blocking_s = 0.0

    def save(self, step: int, state: Any, extras: dict[str, Any]) -> None:
        """Start saving ``state`` (a pytree of arrays) and ``extras`` (JSON) as ``step``."""
        t0 = time.perf_counter()
        extras = {**extras, _CHECKSUM_KEY: state_checksums(state)}
        self._mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     extras=ocp.args.JsonSave(extras)))
        self.last_blocking_s = time.perf_counter() - t0

    def wait(self) -> None:
        self._mgr.wait_until_finished()

    def steps(self) -> list[int]:
        self._mgr.reload()
        return sorted(self._mgr.all_steps())

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, state, extras) of the newest checkpoint that restores cleanly; None if there is none.

        ``abstract_state`` (ShapeDtypeStructs, optionally with shardings) gives the target structure.
        """
        for step in reversed(self.steps()):
            try:
                restored = self._mgr.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), extras=ocp.args.JsonRestore()))
                state, extras = restored["state"], restored["extras"]
                if extras is None or "step" not in extras:
                    raise ValueError("extras missing")
                if not all_finite(state):
                    raise ValueError("non-finite values in restored state")
                want = extras.pop(_CHECKSUM_KEY, None)  # absent in checkpoints written before checksums existed
                if want is not None and state_checksums(state) != want:
                    raise ValueError("state checksum mismatch (corrupt array data)")
                return step, state, extras
            except Exception as e:  # noqa: BLE001 -- any failure means: this checkpoint is unusable
                msg = f"checkpoint {self.directory / str(step)} could not be restored ({type(e).__name__}: {e}); " \
                      "falling back to the previous one"
                warnings.warn(msg, stacklevel=2)
                log.warning(msg)
        return None

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()
