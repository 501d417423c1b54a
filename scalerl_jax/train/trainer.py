"""The RL training run: rollouts -> batches -> pure train steps, with evaluation, compute accounting,
metrics, checkpoints and resume. Scheduling (PipelineRL-k or PPO-off-policy-k) is in
:mod:`scalerl_jax.rollout.orchestrator`.

Compute (the C of the scaling law) is device-seconds of the RL loop: wall time x devices in use
(trainer and generators together, like the paper's GPU-hours), excluding the time spent in evaluation.
The embedded engine shares the trainer's devices, so they count once; a generator fleet adds the devices its
servers report (``generator_devices``). Analytic FLOPs are kept beside it, training (3 x forward) and generation
(forward) separately.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from scalerl_jax.config import ExperimentConfig, forecast_runs, planned_evals
from scalerl_jax.data.curriculum import NPRCurriculum
from scalerl_jax.data.pipeline import PromptData
from scalerl_jax.distributed import Channel
from scalerl_jax.metrics import MetricsWriter, Progress
from scalerl_jax.rollout.orchestrator import PipelineRunner, RolloutBatch, RolloutProducer
from scalerl_jax.rollout.protocol import Generator, LengthControl, SamplingParams
from scalerl_jax.train.core import TrainerCore
from scalerl_jax.train.rl_batch import batch_is_finite, build_train_batch
from scalerl_jax.train.step import TrainState

#: steps between a compacted batch size's first request and its first use: its step compiles beside the loop
#: meanwhile (TrainerCore.prepare_rows)
ROW_SIZE_LEAD = 8


def per_task_rewards(problems, rewards, key: str, count_key: str) -> dict[str, float]:
    """Each task's share of a scored set, for a multi-task run (empty when every problem has one task): per task
    ``t`` (``Problem.task``), ``{key}_{t}`` the pass rate (fraction of completions with reward > 0) and
    ``{count_key}_{t}`` the number of prompts. ``rewards[i]`` holds the rewards of ``problems[i]``'s samples."""
    by_task: dict[str, list[np.ndarray]] = {}
    for p, r in zip(problems, rewards, strict=True):
        by_task.setdefault(p.task, []).append(np.asarray(r, np.float32))
    if len(by_task) < 2:
        return {}
    out: dict[str, float] = {}
    for t in sorted(by_task):
        flat = np.concatenate(by_task[t])
        out[f"{key}_{t}"] = float((flat > 0).mean()) if flat.size else float("nan")
        out[f"{count_key}_{t}"] = len(by_task[t])
    return out


@dataclasses.dataclass
class Counters:
    compute_s: float = 0.0
    eval_s: float = 0.0
    flops_train: float = 0.0
    flops_gen: float = 0.0
    gen_tokens: int = 0
    trainer_busy_s: float = 0.0
    generator_busy_s: float = 0.0
    dropped_stale_batches: int = 0
    skipped_steps: int = 0
    filtered_groups: int = 0
    empty_batches: int = 0


class RLTrainer:
    """Owns the train state, the generator(s), the data stream, metrics and checkpoints of one run."""

    def __init__(
        self, exp: ExperimentConfig, params: Any, *, data: PromptData, encode: Callable[[str], list[int]],
        decode: Callable[[list[int]], str], score: Callable, pad_id: int, eos_ids: tuple[int, ...],
        generator: Generator, eval_generator: Generator, length: LengthControl | None, seq_len: int,
        run_dir: str | Path, resume: bool = False, bos_id: int | None = None, reward_transform=None,
        n_devices: int | None = None, generator_devices: int = 0, log: Callable[[str], None] = print,
        on_batch: Callable[[int, RolloutBatch, Any, Any], None] | None = None, channel: Channel | None = None,
        forecast=None,
    ) -> None:
        self.exp, self.log = exp, log
        # observation hook: on_batch(step, rollout_batch, train_batch, batch_stats) for every batch handed to the
        # train step (after the staleness, finiteness and empty-batch checks), before the update
        self.on_batch = on_batch
        self.mcfg, self.tcfg, self.rcfg = exp.model, exp.train, exp.rollout
        self.run_dir = Path(run_dir)
        self.seq_len, self.pad_id = seq_len, pad_id
        self.n_rows = self.rcfg.prompts_per_batch * self.rcfg.group_size
        self.generator, self.eval_generator = generator, eval_generator
        self.data = data
        self.n_devices = n_devices or len(jax.devices())
        self.generator_devices = int(generator_devices)  # 0: generation shares the trainer's devices
        self.last_sync_s = 0.0
        self.counters = Counters()
        self.size_from: dict[int, int] = {}  # compacted batch size -> the step from which batches use it
        self.curriculum = NPRCurriculum(threshold=exp.data.npr_threshold, enabled=exp.data.npr)
        self.prompts = data.train_iterator(self.curriculum)
        self.sampling = SamplingParams(temperature=self.rcfg.temperature, top_p=self.rcfg.top_p,
                                       max_new_tokens=self.rcfg.max_new_tokens, stop_token_ids=tuple(eos_ids),
                                       n=self.rcfg.group_size)
        self.producer = RolloutProducer(generator, self.prompts, encode=encode, decode=decode, score=score,
                                        sampling=self.sampling, prompts_per_batch=self.rcfg.prompts_per_batch,
                                        length=length, bos_id=bos_id, reward_transform=reward_transform)
        self.eval_producer = RolloutProducer(eval_generator, None, encode=encode, decode=decode, score=score,
                                             sampling=dataclasses.replace(self.sampling, n=self.tcfg.eval_samples),
                                             prompts_per_batch=0, length=length, bos_id=bos_id)
        # the device side (global mesh, sharded state, jitted step, checkpoints); with a channel, every call is
        # mirrored on the follower processes of a multi-process run
        # (with resume and checkpoints on disk, the newest that restores; none restoring stops the run here, before
        # metrics.jsonl is opened, so nothing is lost)
        self.core = TrainerCore(exp, params, seq_len=seq_len, pad_id=pad_id, run_dir=self.run_dir, channel=channel,
                                log=log, resume=resume)
        offset = None
        self.resumed_from = None
        if self.core.restored is not None:
            step, extras = self.core.restored
            self._load_extras(extras)
            offset = extras["metrics_offset"]
            self.resumed_from = step
            log(f"[rl] resumed from checkpoint step {step} ({self.run_dir / 'checkpoints'})")
        elif resume:
            log("[rl] --resume: no checkpoint on disk, starting from the initial weights")
        self.metrics = MetricsWriter(self.run_dir, resume_offset=offset, wandb_project=exp.wandb_project,
                                     wandb_config=dataclasses.asdict(exp) if exp.wandb_project else None,
                                     run_name=self.run_dir.name)
        # the live forecast (scalerl_jax.scaling.live.LiveForecast): started by the caller, or by run() when None
        self.forecast = forecast
        self.last_forecast: dict[str, Any] | None = None  # the newest forecast row (the progress line shows it)
        self.stopped_early: str | None = None  # why --stop-if-worse ended the run
        self.stop_rule = None  # scalerl_jax.scaling.forecast.StopRule, made with the forecast (run())
        self.version = int(self.state.step)
        self._push_weights()
        log(f"[rl] generators hold weights v{self.version} (pushed in {self.last_sync_s:.2f}s)")

    # ---- state / checkpoint helpers ----

    @property
    def state(self) -> TrainState:
        return self.core.state

    def _extras(self) -> dict[str, Any]:
        return {"step": int(self.state.step), "version": self.version, "data": self.producer.resume_state(),
                "curriculum": self.curriculum.state_dict(), "counters": dataclasses.asdict(self.counters),
                "metrics_offset": self.metrics.offset(), "seed": self.tcfg.seed,
                "row_sizes": {str(n): s for n, s in self.size_from.items()}}

    def _load_extras(self, extras: dict[str, Any]) -> None:
        self.curriculum.load_state_dict(extras["curriculum"])
        self.prompts.set_state(extras["data"])
        self.counters = Counters(**extras["counters"])
        # the sizes this run can take (a resume on another mesh or row_buckets may not divide them all)
        q = self.core.row_quantum
        self.size_from = {int(n): int(s) for n, s in extras.get("row_sizes", {}).items()
                          if q and int(n) % q == 0 and int(n) < self.n_rows}
        for n in self.size_from:
            self.core.prepare_rows(n)

    def save_checkpoint(self) -> None:
        self.core.save(int(self.state.step), self._extras())

    def _push_weights(self) -> None:
        t0 = time.perf_counter()
        self.generator.update_weights(self.core.generator_params(), self.version)
        self.last_sync_s = time.perf_counter() - t0

    def _generator_metrics(self) -> dict[str, float]:
        """What the generation back-end reports per step (a fleet: push seconds and bytes, request counters)."""
        fn = getattr(self.generator, "metrics", None)
        return {k: v for k, v in fn().items() if k != "weight_sync_seconds"} if fn is not None else {}

    # ---- evaluation ----

    def evaluate(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        if self.eval_generator is not self.generator:  # one fleet for both already holds self.version
            self.eval_generator.update_weights(self.core.generator_params(), self.version)
        self.eval_generator.reseed(10_000 + self.tcfg.seed * 7919 + int(self.state.step))
        val = self.data.val
        groups, rewards, _, n_tok, counts = self.eval_producer.generate_and_score(val)
        flat = np.concatenate(rewards) if rewards else np.zeros(0)
        trunc = np.mean([c.truncated for g in groups for c in g]) if groups else 0.0
        dt = time.perf_counter() - t0
        self.counters.eval_s += dt
        # a multi-task run: val_reward_<task> and val_n_<task> beside the combined val_reward (RECIPE.md: the paper
        # fits the math and the code curve of its math+code run separately)
        return {"val_reward": float((flat > 0).mean()), "val_n": len(val), "val_k": self.tcfg.eval_samples,
                **per_task_rewards(val, rewards, "val_reward", "val_n"), "val_truncation_rate": float(trunc),
                "val_tokens": n_tok, "eval_seconds": dt, **{
                    f"val_{k}": v for k, v in counts.items()}}

    def _compute_row(self) -> dict[str, float]:
        c = self.counters
        devices = self.n_devices + self.generator_devices
        return {"device_hours": c.compute_s * devices / 3600.0, "device_seconds": c.compute_s * devices,
                "flops": c.flops_train + c.flops_gen, "flops_train": c.flops_train, "flops_gen": c.flops_gen}

    def _eval_row(self) -> None:
        row = {"kind": "eval", "step": int(self.state.step), **self.evaluate(), **self._compute_row()}
        self.metrics.write(row)
        if self.forecast is not None:
            self.forecast.after_eval(force=row["step"] >= self.tcfg.steps)
        by_task = "".join(f", {k[len('val_reward_'):]} {v:.3f}" for k, v in row.items()
                          if k.startswith("val_reward_"))
        self.log(f"[eval] step {row['step']}: val_reward {row['val_reward']:.3f}{by_task} "
                 f"({row['val_n']} prompts x {row['val_k']}), device_hours {row['device_hours']:.5f}")
        self.last_val = row["val_reward"]

    # ---- one update ----

    MAX_BATCHES_WITHOUT_UPDATE = 64

    def _train_on(self, rb: RolloutBatch, t_clock: Callable[[], None], push: bool = True) -> bool:
        """Train on one rollout batch; returns whether the parameters were updated. Raises after
        ``MAX_BATCHES_WITHOUT_UPDATE`` consecutive batches without an update (the run could never finish)."""
        updated = self._train_on_batch(rb, t_clock, push)
        self.producer.consumed(rb.index)
        self._idle_batches = 0 if updated else getattr(self, "_idle_batches", 0) + 1
        if self._idle_batches >= self.MAX_BATCHES_WITHOUT_UPDATE:
            raise RuntimeError(
                f"{self._idle_batches} consecutive rollout batches made no update (every group zero-variance "
                f"filtered, non-finite or stale; see the error rows in {self.run_dir / 'metrics.jsonl'}): the policy "
                "solves none or all of its prompts. Check the base model / warm start and the data.")
        return updated

    def _train_on_batch(self, rb: RolloutBatch, t_clock: Callable[[], None], push: bool = True) -> bool:
        step = int(self.state.step)
        for p, r in zip(rb.problems, rb.rewards):
            self.curriculum.update(p.prompt_id, int((r > 0).sum()), len(r))
        self.counters.gen_tokens += rb.n_generated_tokens
        prompt_tok = sum(len(c.prompt_ids) for g in rb.groups for c in g)
        self.counters.flops_gen += self.mcfg.flops_per_token(self.seq_len // 2) * (rb.n_generated_tokens + prompt_tok)
        staleness = self.version - rb.min_version
        if staleness > self.rcfg.k and self.rcfg.mode == "pipeline":
            self.counters.dropped_stale_batches += 1
            self.metrics.write({"kind": "error", "step": step, "reason": f"batch staleness {staleness} > k; dropped",
                                **self._compute_row()})
            return False
        t_batch = time.perf_counter()
        batch, stats = build_train_batch(rb.groups, rb.rewards, version=self.version, loss_cfg=self.exp.loss,
                                         seq_len=self.seq_len, n_rows=self.n_rows, pad_id=self.pad_id,
                                         microbatches=self.tcfg.microbatches, row_quantum=self.core.row_quantum,
                                         row_sizes=[n for n, s in self.size_from.items() if s <= step],
                                         **self.core.batch_layout())
        if stats.rows_wanted < self.n_rows and stats.rows_wanted not in self.size_from:
            # a new size: compiled beside the loop, used from ROW_SIZE_LEAD steps on (until then such batches are
            # padded to a size in use). Which size a step uses depends on the run alone, never on how fast the
            # compile went, so a run and its resumption round the same way.
            self.size_from[stats.rows_wanted] = step + ROW_SIZE_LEAD
            self.core.prepare_rows(stats.rows_wanted)
        batch_s = time.perf_counter() - t_batch
        self.counters.filtered_groups += stats.n_filtered_groups
        base = {"step": step, "reward_mean": stats.reward_mean, "pass_rate": stats.pass_rate,
                "n_groups": stats.n_groups, "n_filtered_groups": stats.n_filtered_groups,
                "npr_removed": self.curriculum.stats()["n_removed"], "gen_seconds": rb.gen_seconds,
                "gen_tokens_per_s": rb.n_generated_tokens / max(rb.gen_seconds, 1e-9),
                "interruption_rate": stats.interruption_rate, "completion_len": stats.completion_len_mean,
                # share of samples whose reward the length penalty changed (0 without kind=penalty)
                "length_penalty_rate": rb.score_counts.get("length_penalized", 0)
                / max(1, sum(len(g) for g in rb.groups)),
                **per_task_rewards(rb.problems, rb.rewards, "pass_rate", "n_groups")}
        if not batch_is_finite(batch):
            self.counters.skipped_steps += 1
            self.metrics.write({"kind": "error", **base, "reason": "non-finite rewards or log-probs; update skipped",
                                **self._compute_row()})
            return False
        if stats.n_tokens == 0:
            self.counters.empty_batches += 1
            self.metrics.write({"kind": "error", **base, "reason": "every group was filtered (zero variance); "
                                "no update", **self._compute_row()})
            return False
        if self.on_batch is not None:
            self.on_batch(step, rb, batch, stats)
        t0 = time.perf_counter()
        m = self.core.step(batch.as_dict())
        dt = time.perf_counter() - t0
        self.counters.trainer_busy_s += dt
        real_tokens = int((batch.tokens != self.pad_id).sum())
        self.counters.flops_train += 3 * self.mcfg.flops_per_token(self.seq_len // 2) * real_tokens
        if int(m["skipped"]):
            self.counters.skipped_steps += 1
            self.metrics.write({"kind": "error", **base, "reason": "non-finite loss or gradient; update skipped",
                                **self._compute_row()})
            return False
        self.version = int(self.state.step)
        if push:
            self._push_weights()
        t_clock()
        # truncation over the real completions (the step's own mean runs over the batch's rows, padding included)
        row = {"kind": "train", **base, **{k: float(v) for k, v in m.items()}, "step": int(self.state.step),
               "truncation_rate": stats.truncation_rate, "train_rows": int(batch.tokens.shape[0]),
               "batch_staleness": staleness, "step_seconds": dt, "weight_sync_seconds": self.last_sync_s,
               "score_seconds": rb.score_seconds, "batch_seconds": batch_s, "wait_seconds": self._wait_s,
               "loop_seconds": time.perf_counter() - self._loop_t0,
               **self._generator_metrics(), **self._compute_row()}
        self.metrics.write(row)
        self._loop_t0 = time.perf_counter()  # the next train row's loop_seconds: from this row to that one
        self.last_train = row
        return True

    # ---- the live forecast ----

    def _start_forecast(self) -> None:
        fcfg = self.exp.forecast
        if self.forecast is None and not forecast_runs(self.exp):
            if fcfg.enabled:
                self.log(f"[forecast] off: this run makes {planned_evals(self.tcfg)} evals and a refit needs "
                         f"{fcfg.min_evals} (forecast.min_evals)")
            return  # (imported only here: the scaling package brings numpyro and matplotlib into the process)
        from scalerl_jax.scaling.forecast import StopRule

        self.stop_rule = StopRule(fcfg.stop_if_worse, fcfg.stop_min_evals, fcfg.stop_confirmations)
        if self.forecast is None:
            from scalerl_jax.scaling.live import LiveForecast

            self.forecast = LiveForecast(self.run_dir, fcfg, total_steps=self.tcfg.steps, seed=self.tcfg.seed,
                                         log=self.log)
        self.forecast.t0 = time.monotonic()  # its time budget is a share of the RL loop's wall time
        self.log(f"[forecast] refitting the law after each eval from the {fcfg.min_evals}th on, in process "
                 f"{self.forecast.proc.pid} (low priority, CPU)" + (f"; baseline {fcfg.baseline}" if fcfg.baseline
                                                                    else ""))

    def _forecast_rows(self, rows: list[dict]) -> None:
        """Write the forecast rows that came back; apply --stop-if-worse."""
        for row in rows:
            row = {**row, "run_step": int(self.state.step)}
            self.metrics.write(row)
            self.last_forecast = row
            why, note = self.stop_rule.update(row)
            if note is not None:
                self.log(f"[forecast] {note}")
            if why is not None and self.stopped_early is None:
                self.stopped_early = why
                self.log(f"[forecast] {why}")

    def _progress_fields(self) -> dict[str, Any]:
        f = self.last_forecast
        if not f:
            return {}
        out = {"A": f"{f['A_mean']:.2f} [{f['A_lo']:.2f}, {f['A_hi']:.2f}]"}
        if "P_A_gt_baseline" in f:
            out["P(A>base)"] = f"{f['P_A_gt_baseline']:.2f}"
        return out

    # ---- the run ----

    def run(self) -> dict[str, Any]:
        total = self.tcfg.steps
        every = max(self.tcfg.eval_every, 1)
        self.last_val = float("nan")
        self.last_train: dict[str, Any] = {}
        progress = Progress(total, desc=f"rl:{self.rcfg.mode}", start=int(self.state.step))
        t_last = [time.perf_counter()]
        eval_before = [self.counters.eval_s]

        def t_clock() -> None:  # advance the compute clock by the wall time since the last tick, minus eval time
            now = time.perf_counter()
            self.counters.compute_s += (now - t_last[0]) - (self.counters.eval_s - eval_before[0])
            t_last[0], eval_before[0] = now, self.counters.eval_s

        self._start_forecast()
        if self.resumed_from is None:
            self._eval_row()
        t_last[0], eval_before[0] = time.perf_counter(), self.counters.eval_s
        wall0 = self._loop_t0 = time.perf_counter()
        self._wait_s = 0.0  # pipeline mode: the trainer's wait for the step's batch
        runner = None
        try:
            if self.rcfg.mode == "pipeline":
                runner = PipelineRunner(self.producer, self.rcfg.k, start_index=int(self.state.step)).start()
            while int(self.state.step) < total and self.stopped_early is None:
                before = int(self.state.step)
                if self.rcfg.mode == "pipeline":
                    t_wait = time.perf_counter()
                    rb = runner.get(timeout=self.rcfg.batch_timeout_s)
                    self._wait_s = time.perf_counter() - t_wait
                    if not self._train_on(rb, t_clock):
                        runner.consumed_without_update()  # else the throttle would wait for a version forever
                else:
                    self._ppo_round(t_clock)
                t_clock()
                step = int(self.state.step)
                if self.forecast is not None:
                    self._forecast_rows(self.forecast.poll())
                progress.update(step, reward=self.last_train.get("reward_mean", float("nan")),
                                val=self.last_val, tok_s=self.last_train.get("gen_tokens_per_s", 0.0),
                                **self._progress_fields())
                crossed = lambda n: step // n > before // n  # noqa: E731
                if step > before and (crossed(every) or step >= total):
                    self._eval_row()
                # PPO-off-policy: every loop iteration ends at a round boundary (what resume needs), also when a
                # skipped update left the step count off a multiple of k
                if step > before and (crossed(self.tcfg.checkpoint_every) or step >= total
                                      or self.stopped_early is not None):
                    self.save_checkpoint()
        finally:
            if runner is not None:
                runner.stop()
                self.counters.generator_busy_s += runner.busy_s
            progress.close()
            if self.forecast is not None:
                try:
                    if self.stopped_early is None and int(self.state.step) >= total:
                        self._forecast_rows(self.forecast.finish())  # the last eval's forecast
                finally:
                    self.forecast.close()
        wall = time.perf_counter() - wall0
        self.core.wait()
        summary = {"steps": int(self.state.step), "wall_seconds": wall, "final_val_reward": self.last_val,
                   "trainer_devices": self.n_devices, "generator_devices": self.generator_devices,
                   **self._generator_metrics(),
                   "trainer_busy_fraction": self.counters.trainer_busy_s / max(wall, 1e-9),
                   "generator_busy_fraction": self.counters.generator_busy_s / max(wall, 1e-9),
                   **dataclasses.asdict(self.counters), **self._compute_row(),
                   "npr": self.curriculum.stats(), "stopped_early": self.stopped_early,
                   **({"forecast": {"rows": len(self.forecast.rows), "skipped_for_budget": self.forecast.skipped,
                                    "fit_seconds": self.forecast.fit_seconds,
                                    "share_of_wall": self.forecast.fit_seconds / max(wall, 1e-9),
                                    "fit_cpu_seconds": self.forecast.fit_cpu_seconds,
                                    "cpu_share": self.forecast.fit_cpu_seconds / max(wall, 1e-9),
                                    "stopped": self.forecast.dead}} if self.forecast is not None else {})}
        self.metrics.write({"kind": "summary", **summary})
        return summary

    def _ppo_round(self, t_clock) -> None:
        """PPO-off-policy-k: k batches from the current policy, then k updates; weights pushed after."""
        step = int(self.state.step)
        self.generator.reseed(self.tcfg.seed * 1_000_003 + step)
        t0 = time.perf_counter()
        batches = [self.producer.produce(step + j) for j in range(self.rcfg.k)]
        self._wait_s = time.perf_counter() - t0  # the round's generation: the first update of the round waits it
        self.counters.generator_busy_s += self._wait_s
        for rb in batches:
            if int(self.state.step) >= self.tcfg.steps:
                break
            # the generator is not updated inside a round: the trained batch j is j versions stale
            self._train_on(rb, t_clock, push=False)
            self._wait_s = 0.0
        self._push_weights()

    def close(self, error: str | None = None) -> None:
        """Close the checkpoints and metrics. A multi-process run's followers: with ``error`` they are released and
        exit non-zero; without, they close their checkpoints too and wait for the leader's final "stop" (sent by
        :func:`experiments.run_path.run_experiment` after the fit and the report)."""
        try:
            if error is not None:
                self.core.stop(error)
            else:
                self.core.finish()
        finally:
            self.core.close()
            self.metrics.close()
