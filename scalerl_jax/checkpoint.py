"""Orbax checkpoints of a whole RL run: params, optimiser state, step, plus a JSON side car holding the
RNG, the data-iterator state, the curriculum, the compute counters and the metrics.jsonl offset.

Saves are asynchronous (the train loop only blocks for the device-to-host copy); the last
``keep`` checkpoints are kept. :meth:`RunCheckpointer.restore_latest` walks back from the newest step and
skips, with a warning, any checkpoint that fails to restore (partial or corrupt), so a run killed in the
middle of a save resumes from the previous good one.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


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
                leaves = jax.tree.leaves(state)
                if not all(np.all(np.isfinite(np.asarray(x))) for x in leaves if np.asarray(x).dtype.kind == "f"):
                    raise ValueError("non-finite values in restored state")
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
