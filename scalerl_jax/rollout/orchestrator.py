"""Rollout scheduling: PipelineRL-k (streaming, in-flight weight updates) and PPO-off-policy-k.

:class:`RolloutProducer` turns prompts into scored groups: it draws ``prompts_per_batch`` problems from the
prompt iterator, asks the generator for G samples each, scores them and returns a :class:`RolloutBatch`.

Pipeline mode (RECIPE.md section 3): a background thread produces batches back to back into a queue. The
trainer takes batch ``i`` as its step ``i`` and, after every update, pushes the new weights to the generator
in flight. Throttling: the producer does not start batch ``i`` while ``i - n - weight_version > k`` (``n`` the
batches consumed without an update, e.g. entirely zero-variance filtered), so every token of batch ``i`` comes from
a policy at most ``k`` versions older than the one it is trained on; the trainer re-checks the per-token versions
and drops (and counts) any batch that is staler anyway.

PPO-off-policy mode: the trainer calls :meth:`RolloutProducer.produce` k times with the current weights,
then makes k updates; generation waits meanwhile.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from scalerl_jax.data.tasks import Problem
from scalerl_jax.rollout.protocol import Completion, GenerationRequest, Generator, LengthControl, SamplingParams

ScoreFn = Callable[[list[str], list[Problem]], tuple[np.ndarray, dict]]


@dataclass
class RolloutBatch:
    index: int
    problems: list[Problem]
    groups: list[list[Completion]]
    rewards: list[np.ndarray]  # +1 / -1 per completion, per group
    gen_seconds: float
    n_generated_tokens: int
    score_counts: dict = field(default_factory=dict)
    score_seconds: float = 0.0  # wall time of decoding and scoring the completions (after gen_seconds)

    @property
    def min_version(self) -> int:
        vs = [v for g in self.groups for c in g for v, inj in zip(c.versions, c.injected) if not inj]
        return min(vs) if vs else 1 << 30


class RolloutProducer:
    """Draws prompts, generates G samples per prompt, scores them.

    ``encode``/``decode`` map text to token ids and back (the tokenizer); ``score`` returns per-completion
    rewards in {+1, -1} and counts; ``reward_transform`` (optional) reshapes rewards (e.g. the DAPO length
    penalty) given (rewards, completions), and the counts then carry ``length_penalized``: the samples it changed.
    """

    def __init__(self, generator: Generator, prompts, *, encode: Callable[[str], list[int]],
                 decode: Callable[[list[int]], str], score: ScoreFn, sampling: SamplingParams,
                 prompts_per_batch: int, length: LengthControl | None = None, bos_id: int | None = None,
                 reward_transform: Callable | None = None) -> None:
        self.generator = generator
        self.prompts = prompts
        self.encode, self.decode, self.score = encode, decode, score
        self.sampling, self.length = sampling, length
        self.prompts_per_batch = prompts_per_batch
        self.bos_id = bos_id
        self.reward_transform = reward_transform
        self.prompt_lock = threading.Lock()  # the prompt iterator is shared with checkpointing
        self._drawn: dict[int, dict] = {}  # batch index -> the prompt iterator's state before it was drawn

    def requests_for(self, problems: Sequence[Problem],
                     sampling: SamplingParams | None = None) -> list[GenerationRequest]:
        out = []
        for p in problems:
            ids = self.encode(p.prompt)
            if self.bos_id is not None and ids[:1] != [self.bos_id]:  # a chat template may have written it
                ids = [self.bos_id, *ids]
            out.append(GenerationRequest(prompt_ids=ids, params=sampling or self.sampling, length=self.length,
                                         request_id=str(p.prompt_id),
                                         meta={"prompt_id": p.prompt_id, "task": p.task}))
        return out

    def generate_and_score(self, problems: Sequence[Problem], sampling: SamplingParams | None = None):
        t0 = time.perf_counter()
        groups = self.generator.generate(self.requests_for(problems, sampling))
        dt = time.perf_counter() - t0
        texts = [self.decode(c.token_ids) for g in groups for c in g]
        flat_problems = [p for p, g in zip(problems, groups) for _ in g]
        rewards, counts = self.score(texts, flat_problems)
        rewards = np.asarray(rewards, np.float32)
        if self.reward_transform is not None:
            shaped = np.asarray(self.reward_transform(rewards, [c for g in groups for c in g]), np.float32)
            counts = {**counts, "length_penalized": int(np.sum(shaped != rewards))}  # samples the shaping changed
            rewards = shaped
        split, i = [], 0
        for g in groups:
            split.append(rewards[i : i + len(g)])
            i += len(g)
        n_tok = sum(len(c.token_ids) for g in groups for c in g)
        return groups, split, dt, n_tok, counts

    def produce(self, index: int) -> RolloutBatch:
        with self.prompt_lock:
            self._drawn[index] = self.prompts.get_state()
            problems = self.prompts.next_batch(self.prompts_per_batch)
        t0 = time.perf_counter()
        groups, rewards, dt, n_tok, counts = self.generate_and_score(problems)
        # what is not generation is decoding and scoring
        return RolloutBatch(index, problems, groups, rewards, dt, n_tok, counts, time.perf_counter() - t0 - dt)

    def consumed(self, index: int) -> None:
        """The trainer is done with batch ``index`` (trained on it, or dropped it)."""
        with self.prompt_lock:
            for i in [i for i in self._drawn if i <= index]:
                del self._drawn[i]

    def resume_state(self) -> dict:
        """The prompt iterator's state to checkpoint: from before the oldest batch drawn but not yet consumed (in
        pipeline mode up to k + 1 batches are generating ahead of the trainer), so a resumed run trains on those
        prompts instead of skipping them."""
        with self.prompt_lock:
            return self._drawn[min(self._drawn)] if self._drawn else self.prompts.get_state()


class PipelineRunner:
    """Background producer thread for PipelineRL-k with staleness throttling."""

    def __init__(self, producer: RolloutProducer, k: int, start_index: int = 0, max_queue: int | None = None):
        self.producer, self.k = producer, k
        self._next = start_index
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue or (k + 1))
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.busy_s = 0.0
        self.throttled_s = 0.0
        self._no_update = 0  # consumed batches that made no update (all filtered, skipped or dropped)
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def consumed_without_update(self) -> None:
        """The trainer took a batch but made no update, so the version it is waiting on will come one batch later.

        A batch trained at version V holds tokens of versions >= w where w is the generator's version when it
        started; updates only happen on consumed batches, so V <= i - (batches consumed without update) and the
        throttle ``i - no_update - w <= k`` keeps the staleness bound while letting generation continue."""
        self._no_update += 1

    def start(self) -> PipelineRunner:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                i = self._next
                t0 = time.perf_counter()
                while (i - self._no_update - self.producer.generator.weight_version > self.k
                       and not self._stop.is_set()):
                    time.sleep(0.002)
                self.throttled_s += time.perf_counter() - t0
                if self._stop.is_set():
                    break
                t1 = time.perf_counter()
                batch = self.producer.produce(i)
                self.busy_s += time.perf_counter() - t1
                self._next += 1
                while not self._stop.is_set():
                    try:
                        self._queue.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # noqa: BLE001 -- surfaced to the trainer thread by get()
            self._error = e
            traceback.print_exc()

    def get(self, timeout: float = 600.0) -> RolloutBatch:
        deadline = time.time() + timeout
        while True:
            if self._error is not None:
                raise RuntimeError(f"rollout producer failed: {self._error!r}") from self._error
            try:
                return self._queue.get(timeout=0.1)
            except queue.Empty:
                if time.time() > deadline:
                    raise TimeoutError(f"no rollout batch within {timeout:.0f}s") from None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
