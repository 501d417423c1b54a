"""The device side of an RL run, the part every process of a multi-process run executes together: the global
mesh, the sharded train state, the jitted train step, weight gathering for the generators and the checkpoints.

:class:`~scalerl_jax.train.trainer.RLTrainer` (the leader, process 0) calls these methods; in a multi-process run
each call is first sent to the followers over a :class:`~scalerl_jax.distributed.Channel`, and every follower runs
the same method in :meth:`TrainerCore.follow`, so the collectives inside (the train step's, the gather's,
orbax's) line up. In a single process there is no channel and nothing is sent.

- ``step(batch)``: the leader's host batch reaches every process (broadcast); each places only the rows its own
  devices hold, and the same jitted step runs on the global mesh (one compiled program per row count of a
  compacted batch, ``row_quantum``; every process compiles each count in a background thread some steps before
  its batches use it, on the leader's word).
- ``generator_params()``: the current weights for the generators. One process: device copies (the embedded
  engine reads them in place). Several: gathered once to host NumPy on every process (a collective), used by the
  leader only.
- ``save`` / ``restore``: orbax writes every process's shards; a checkpoint restores onto whatever mesh and
  process count this run has (orbax reshards to the target shardings), checked against the side car's
  checksums.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import distributed as dist
from scalerl_jax import sharding as shd
from scalerl_jax.checkpoint import RunCheckpointer
from scalerl_jax.config import ExperimentConfig
from scalerl_jax.models import shared_prefix
from scalerl_jax.models.hf_sharded import ReadStats
from scalerl_jax.train.optim import make_optimizer
from scalerl_jax.train.rl import rl_loss
from scalerl_jax.train.rl_batch import bucket_quantum, build_train_batch
from scalerl_jax.train.state_init import init_sharded_state
from scalerl_jax.train.step import TrainState, jit_train_step, make_train_step, state_shardings

COMPILE_NICE = 10  # niceness of the thread that compiles compacted batch sizes beside the loop


class TrainerCore:
    def __init__(self, exp: ExperimentConfig, params: Any, *, seq_len: int, pad_id: int, run_dir: str | Path,
                 channel: dist.Channel | None = None, log=print, resume: bool = False) -> None:
        """``params``: the base weights, an HF checkpoint directory (read per shard) or a pytree of arrays. With
        ``resume`` and checkpoints on disk, the newest one that restores becomes the state (``self.restored`` =
        (step, extras)) and the base weights are never read; when checkpoints exist and none restores, a
        :class:`~scalerl_jax.checkpoint.ResumeError` names each one and why."""
        self.exp, self.log = exp, log
        self.channel = channel
        self.multi = jax.process_count() > 1
        self.mcfg, self.tcfg = exp.model, exp.train
        self.n_rows = exp.rollout.prompts_per_batch * exp.rollout.group_size
        self.mesh = shd.make_mesh(exp.mesh)
        self.optimizer = make_optimizer(self.tcfg)
        self.abstract_state, self.state_sh = state_shardings(self.mcfg, self.optimizer, self.mesh)
        # the split layout (each group's prompt computed once) where the model and the row length allow it
        why_not = (shared_prefix.supported(self.mcfg, seq_len) if self.tcfg.shared_prefix
                   else "train.shared_prefix=False")
        prompt_cols = seq_len - exp.rollout.max_new_tokens
        self.prefix_layout = None if why_not or prompt_cols < 1 else (prompt_cols, exp.rollout.group_size)
        if self.tcfg.shared_prefix and why_not:
            log(f"[rl] every row computes its own prompt in the train step: {why_not}")
        loss_fn = rl_loss(self.mcfg, exp.loss, temperature=exp.rollout.temperature, shared_prefix=self.prefix_layout)
        step_fn = make_train_step(loss_fn, self.optimizer, self.tcfg.microbatches)
        dummy = build_train_batch([], [], version=0, loss_cfg=exp.loss, seq_len=seq_len, n_rows=self.n_rows,
                                  pad_id=pad_id)[0].as_dict()
        self.batch_sh = shd.batch_shardings(dummy, self.mesh)
        # compacted batches (TrainConfig.row_buckets) keep whole groups, whole micro-batches and whole shards
        self.row_quantum = bucket_quantum(self.n_rows, self.tcfg.row_buckets, math.lcm(
            self.tcfg.microbatches * exp.rollout.group_size, shd.batch_shards(self.mesh)))
        self._batch_template = {k: (v.shape[1:], v.dtype) for k, v in dummy.items()}
        self._compiled: dict[int, Any] = {}  # row count -> the step compiled for it (in the background)
        self._compiled_lock = threading.Lock()
        self._pending: dict[int, Future] = {}  # row count -> its background compile
        self._compile_pool: ThreadPoolExecutor | None = None
        self.step_fn = jit_train_step(step_fn, self.state_sh, self.batch_sh, self.mesh)
        self.ckpt = RunCheckpointer(Path(run_dir) / "checkpoints", keep=self.tcfg.keep_checkpoints)
        self.read_stats = ReadStats()  # the base weights' bytes this process read (its own shards only)
        self.restored: tuple[int, dict[str, Any]] | None = None
        self.state: TrainState
        steps = self._checkpoint_steps() if resume else []
        if steps:
            self.restored = self._restore(steps)
        else:
            self.state = init_sharded_state(params, self.mcfg, self.optimizer, self.state_sh, stats=self.read_stats)
            if self.read_stats.reads:
                log(f"[dist] process {jax.process_index()}: read {self.read_stats.bytes_read / 1e9:.3f} GB of base "
                    f"weights (its devices' blocks) in {self.read_stats.reads} slice reads")

    def _send(self, cmd: str, meta: dict[str, Any] | None = None, arrays: dict[str, np.ndarray] | None = None):
        if self.channel is not None:
            self.channel.send(cmd, meta, arrays)

    # ---- the commands (the leader calls them; followers run them from follow()) ----

    def _checkpoint_steps(self) -> list[int]:
        """The checkpoint steps on disk as the leader sees them (every process tries the same ones, in order)."""
        steps = self.ckpt.steps()
        if self.multi:
            steps = dist.leader_json("checkpoint_steps", steps)
        return steps

    def _restore(self, steps: list[int]) -> tuple[int, dict[str, Any]]:
        """Restore the newest of ``steps`` that restores cleanly in every process; (step, extras). Every process
        runs it at start-up (followers from :func:`follow_leader`); they agree after each attempt, so one process's
        read error moves all of them to the previous checkpoint together, never into a collective alone."""
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                self.abstract_state, self.state_sh)
        agree = (lambda tag, err: dist.agree(f"restore/{tag}", err)) if self.multi else None
        step, self.state, extras = self.ckpt.restore_latest(abstract, steps=steps, agree=agree)
        return step, extras

    def batch_layout(self) -> dict[str, int]:
        """``build_train_batch``'s layout arguments for this trainer's loss (the split layout or the plain rows)."""
        if self.prefix_layout is None:
            return {}
        return {"prompt_cols": self.prefix_layout[0], "group_size": self.prefix_layout[1]}

    def step(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """One train step on the leader's host batch; host metrics."""
        self._send("step", arrays=batch)
        return self._step(batch)

    def _step(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        if self.multi:
            placed = dist.put_global(batch, self.batch_sh)
        else:
            placed = jax.device_put(batch, self.batch_sh)
        # a compacted batch runs the program compiled for its row count (waiting for its background compile if that
        # is still running); the full batch and a count whose compile failed go through jit, which compiles on
        # first use
        rows = int(batch["tokens"].shape[0])
        pending = self._pending.get(rows)
        if pending is not None:
            pending.result()
        with self._compiled_lock:
            step_fn = self._compiled.get(rows, self.step_fn)
        self.state, m = step_fn(self.state, placed)
        return jax.device_get(m)

    # ---- compacted batches: a train step per row count, compiled without stalling the loop ----

    def prepare_rows(self, rows: int) -> None:
        """Start compiling the step for batches of ``rows`` rows in a background thread (once). The trainer asks
        for a size some steps before its batches use it (RLTrainer's ``size_from``); a batch that arrives earlier
        waits for the compile, and a failed compile is logged and leaves the size to jit."""
        if rows >= self.n_rows or rows in self._pending:
            return
        self._send("prepare", {"rows": rows})  # followers compile it beside their loop too
        if self._compile_pool is None:
            self._compile_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-step")
        self._pending[rows] = self._compile_pool.submit(self._compile_rows, rows)

    def _compile_rows(self, rows: int) -> None:
        t0 = time.perf_counter()
        _yield_cpu()
        try:
            state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                 self.abstract_state, self.state_sh)
            batch = {k: jax.ShapeDtypeStruct((rows, *shape), dtype, sharding=self.batch_sh[k])
                     for k, (shape, dtype) in self._batch_template.items()}
            compiled = self.step_fn.lower(state, batch).compile()
            with self._compiled_lock:
                self._compiled[rows] = compiled
            self.log(f"[rl] train step compiled for compacted batches of {rows} rows "
                     f"({time.perf_counter() - t0:.1f}s, beside the loop)")
        except Exception as e:  # noqa: BLE001 - a size that does not compile is simply not used
            self.log(f"[rl] the train step for {rows} rows did not compile in the background ({type(e).__name__}: "
                     f"{e}); batches of that size compile it when they run")

    def generator_params(self) -> Any:
        """The current weights for the generators (module docstring)."""
        self._send("gather")
        return self._gather()

    def _gather(self) -> Any:
        if self.multi:
            return dist.gather_to_host(self.state.params)
        # a copy: the train step donates (deletes) the state's buffers on its next call
        return jax.tree.map(jnp.copy, self.state.params)

    def save(self, step: int, extras: dict[str, Any]) -> None:
        self._send("save", {"step": step, "extras": extras})
        self.ckpt.save(step, self.state, extras)

    def wait(self) -> None:
        self._send("wait")
        self.ckpt.wait()

    def stop(self, error: str | None = None) -> None:
        """Release the followers (they leave :meth:`follow`; with ``error`` they exit non-zero)."""
        if self.channel is not None and not self.channel.closed:
            self.channel.send("stop", {"error": error})
        self.channel = None

    def finish(self) -> None:
        """The run's training is over: every process closes its checkpointer (orbax's last saves finish together),
        and the followers keep waiting for the final "stop", which the leader sends after its fit and report (a
        follower that left earlier would reach JAX's shutdown barrier while the leader still writes)."""
        self._send("close")
        self.channel = None
        self.close()

    def close(self) -> None:
        if not getattr(self, "_closed", False):
            self._closed = True
            if getattr(self, "_compile_pool", None) is not None:
                self._compile_pool.shutdown(wait=False, cancel_futures=True)
            self.ckpt.close()

    # ---- the follower's side ----

    def follow(self, channel: dist.Channel) -> None:
        """Run the leader's commands until it says stop; raises if the leader stopped with an error."""
        while True:
            cmd, meta, arrays = channel.recv()
            if cmd == "step":
                self._step(arrays)
            elif cmd == "gather":
                self._gather()
            elif cmd == "prepare":
                self.prepare_rows(int(meta["rows"]))
            elif cmd == "save":
                self.ckpt.save(meta["step"], self.state, meta["extras"])
            elif cmd == "wait":
                self.ckpt.wait()
            elif cmd == "close":  # training is over; the leader fits and reports, then says stop
                self.close()
            elif cmd == "stop":
                if meta.get("error"):
                    raise RuntimeError(f"the leader (process 0) stopped the run: {meta['error']}")
                return
            else:
                raise RuntimeError(f"unknown command from the leader: {cmd!r}")


def _yield_cpu(nice: int = COMPILE_NICE) -> None:
    """Lower the calling thread's scheduling priority (on Linux a thread's niceness is its own, and threads it
    starts inherit it): a background compile then takes the CPU the loop leaves, instead of slowing its steps."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
    except (AttributeError, OSError):  # not Linux, or not permitted: compile at the normal priority
        pass


# ---- start-up handshake: the leader tells the followers what to build --------------------------------------


def announce(channel: dist.Channel, exp: ExperimentConfig, *, base_dir: str, seq_len: int, pad_id: int,
             resume: bool) -> None:
    """Leader: what every follower needs to build the same TrainerCore (the resolved config, the base model
    directory the params are loaded from, row length, pad id, resume)."""
    import dataclasses

    channel.send("start", {"exp": json.loads(json.dumps(dataclasses.asdict(exp), default=str)),
                           "base_dir": str(base_dir), "seq_len": seq_len, "pad_id": pad_id, "resume": resume})


def follow_leader(log=print) -> None:
    """A follower's whole run: wait for the leader's start message, load the same base weights, build the core,
    restore like the leader does, then run its commands until it stops."""
    from scalerl_jax.config import from_dict

    channel = dist.Channel()
    cmd, meta, _ = channel.recv()
    if cmd == "stop":  # the leader failed before the trainer existed
        if meta.get("error"):
            raise RuntimeError(f"the leader (process 0) stopped the run: {meta['error']}")
        return
    if cmd != "start":
        raise RuntimeError(f"expected the leader's start message, got {cmd!r}")
    exp = from_dict(ExperimentConfig, meta["exp"])
    # the base weights: this process reads only the blocks its own devices hold
    core = TrainerCore(exp, meta["base_dir"], seq_len=meta["seq_len"], pad_id=meta["pad_id"], run_dir=exp.out_dir,
                       log=log, resume=meta["resume"])
    try:
        log(f"[dist] process {jax.process_index()}: following the leader ({core.mesh.devices.size} devices in the "
            "mesh)")
        core.follow(channel)
    finally:
        core.close()
