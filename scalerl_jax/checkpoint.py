"""Orbax checkpoints of a whole RL run: params, optimiser state, step, plus a JSON side car holding the
RNG, the data-iterator state, the curriculum, the compute counters and the metrics.jsonl offset.

Saves are asynchronous (the train loop only blocks for the device-to-host copy); the last
``keep`` checkpoints are kept. :meth:`RunCheckpointer.restore_latest` walks back from the newest step and
skips, with a warning, any checkpoint that fails to restore (partial or corrupt), so a run killed in the
middle of a save resumes from the previous good one; when none restores it raises :class:`ResumeError` naming
each checkpoint and why, and the run stops before it writes anything.

Orbax does not checksum array data: a flipped byte in a chunk file restores silently as a wrong value. So the
side car also holds a checksum of every state leaf (computed on device at save, order-independent modular
sums of the raw bits, so sharded arrays need no gather), and a restored state whose checksums differ counts
as corrupt.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable
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


class ResumeError(RuntimeError):
    """``--resume`` found checkpoints but none restores (or none at all): the message names each one and why."""


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

    def restore_latest(self, abstract_state: Any, *, steps: list[int] | None = None,
                       agree: Callable[[str, str | None], list[tuple[int, str]]] | None = None,
                       ) -> tuple[int, Any, dict[str, Any]]:
        """(step, state, extras) of the newest checkpoint that restores cleanly.

        ``abstract_state`` (ShapeDtypeStructs, optionally with shardings) gives the target structure; ``steps``
        the candidates (default: every step on disk). A checkpoint that fails is skipped with a warning. In a
        multi-process run ``agree(tag, error or None)`` returns every process's failure (process, reason): the
        processes agree after checking the files (:meth:`preflight`) and after the read, so all of them skip a
        checkpoint together or none does, and none enters a collective alone. Raises :class:`ResumeError` naming
        every checkpoint and why it was refused when none restores (or none exists).
        """
        steps = self.steps() if steps is None else list(steps)
        refused: list[tuple[int, str]] = []
        for step in reversed(steps):
            err, state, extras = None, None, None
            try:
                self.preflight(step)
            except Exception as e:  # noqa: BLE001 -- unreadable here: this checkpoint is unusable
                err = f"{type(e).__name__}: {e}"
            if agree is not None:  # orbax's restore is collective: every process enters it, or none does
                failures = agree(f"{step}/files", err)
                if failures:
                    err = "; ".join(f"process {p}: {r}" for p, r in failures)
            if err is not None:
                refused.append((step, err))
                self._warn_refused(step, err)
                continue
            try:
                restored = self._mgr.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state), extras=ocp.args.JsonRestore()))
                state, extras = restored["state"], restored["extras"]
                if extras is None or "step" not in extras:
                    raise ValueError("extras missing")
            except Exception as e:  # noqa: BLE001 -- any failure means: this checkpoint is unusable
                err = f"{type(e).__name__}: {e}"
            if agree is not None:  # the checks below are collectives: every process must reach them, or none
                failures = agree(f"{step}/restore", err)
                if failures:
                    err = "; ".join(f"process {p}: {r}" for p, r in failures)
            if err is None:  # the same verdict on every process: computed on the global arrays
                if not all_finite(state):
                    err = "non-finite values in restored state"
                else:
                    want = extras.pop(_CHECKSUM_KEY, None)  # absent in checkpoints written before checksums
                    if want is not None and state_checksums(state) != want:
                        err = "state checksum mismatch (corrupt array data)"
            if err is None:
                return step, state, extras
            refused.append((step, err))
            self._warn_refused(step, err)
        if not refused:
            raise ResumeError(f"no checkpoint in {self.directory}")
        raise ResumeError(f"none of the {len(refused)} checkpoint(s) in {self.directory} restores: "
                          + "; ".join(f"step {s}: {r}" for s, r in refused))

    def preflight(self, step: int) -> None:
        """This process can read checkpoint ``step``'s files: its directory, commit marker and metadata parse, and
        every file under it can be opened (raises naming the file). Run before orbax's collective restore, so a
        process that cannot see the files (a node's mount, permissions) is found before the others enter it."""
        d = self.directory / str(step)
        if not d.is_dir():
            raise FileNotFoundError(f"{d}: no such checkpoint directory")
        for sub in ("state", "extras"):
            if not (d / sub).is_dir():
                raise FileNotFoundError(f"{d / sub}: missing (an interrupted save?)")
        for f in d.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    fh.read(1)
        if (d / "_CHECKPOINT_METADATA").is_file():
            json.loads((d / "_CHECKPOINT_METADATA").read_text())

    def _warn_refused(self, step: int, err: str) -> None:
        msg = f"checkpoint {self.directory / str(step)} could not be restored ({err}); trying the previous one"
        warnings.warn(msg, stacklevel=3)
        log.warning(msg)

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()
