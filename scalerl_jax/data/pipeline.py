"""Training prompt stream and validation set.

:class:`PromptIterator` yields training problems forever, one shuffled epoch after another. Each epoch is a
``grain.MapDataset`` over the prompts still active at the epoch's start, shuffled with a seed derived from
``(seed, epoch)``; the No-Positive-Resampling curriculum (anything with ``filter(prompt_ids) -> list`` of the active
ids, e.g. :class:`scalerl_jax.data.curriculum.NPRCurriculum`) is consulted only at epoch boundaries, so prompts it
removes never appear in a later epoch, while the current epoch is left untouched.

The iterator state is a small JSON-serialisable dict: ``epoch``, ``position`` (prompts consumed in that epoch)
and ``excluded`` (ids inactive at that epoch's start, None before the first epoch starts). Restoring it together
with the curriculum's own state continues with exactly the same next prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grain
import numpy as np

from scalerl_jax.data.chain import chain_split
from scalerl_jax.data.jsonl import DEFAULT_TEMPLATE, load_jsonl
from scalerl_jax.data.tasks import Problem, arith_split

_SALT = 0x5045504F  # separates the epoch-shuffle stream from other users of the same seed


class AllPromptsRemovedError(RuntimeError):
    """Every training prompt has been removed by the curriculum: there is nothing left to train on."""


class Curriculum(Protocol):
    """The part of the curriculum the pipeline uses."""

    def filter(self, prompt_ids: Sequence[int]) -> list[int]: ...


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of ``epoch`` (a 32-bit integer derived from ``(seed, epoch)``)."""
    return int(np.random.SeedSequence([int(seed), int(epoch), _SALT]).generate_state(1)[0])


class PromptIterator:
    """Infinite, deterministic, resumable iterator over training problems (see the module docstring).

    ``problems`` must have distinct ``prompt_id``s. ``curriculum`` may be None (no prompt is ever removed).
    """

    def __init__(self, problems: Sequence[Problem], seed: int, curriculum: Curriculum | None = None) -> None:
        self._problems = list(problems)
        if not self._problems:
            raise ValueError("PromptIterator: no training problems")
        ids = [p.prompt_id for p in self._problems]
        if len(set(ids)) != len(ids):
            raise ValueError("PromptIterator: prompt_ids must be distinct")
        self._by_id = {p.prompt_id: p for p in self._problems}
        self.seed = int(seed)
        self.curriculum = curriculum
        self._epoch = 0
        self._position = 0
        self._excluded: list[int] | None = None
        self._order: grain.MapDataset | None = None

    # -- epochs ------------------------------------------------------------------------------------------------
    def _build_epoch(self) -> None:
        assert self._excluded is not None
        excluded = set(self._excluded)
        active = [p for p in self._problems if p.prompt_id not in excluded]
        if not active:
            raise AllPromptsRemovedError(
                f"PromptIterator: all {len(self._problems)} training prompts have been removed by the curriculum "
                f"at the start of epoch {self._epoch}; nothing is left to train on"
            )
        self._order = grain.MapDataset.source(active).shuffle(seed=epoch_seed(self.seed, self._epoch))

    def _begin_epoch(self, epoch: int) -> None:
        self._epoch, self._position = epoch, 0
        ids = [p.prompt_id for p in self._problems]
        if self.curriculum is None:
            self._excluded = []
        else:
            active = set(self.curriculum.filter(ids))
            self._excluded = sorted(i for i in ids if i not in active)
        self._build_epoch()

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return self._epoch

    @property
    def epoch_size(self) -> int:
        """Number of prompts in the current epoch (starting it if needed)."""
        if self._order is None:
            self._begin_epoch(self._epoch)
        return len(self._order)

    # -- iteration ---------------------------------------------------------------------------------------------
    def __iter__(self) -> PromptIterator:
        return self

    def __next__(self) -> Problem:
        if self._order is None:
            self._begin_epoch(self._epoch)
        if self._position >= len(self._order):
            self._begin_epoch(self._epoch + 1)
        p = self._order[self._position]
        self._position += 1
        return p

    def next_batch(self, n: int) -> list[Problem]:
        """The next ``n`` problems (crossing epoch boundaries as needed)."""
        return [next(self) for _ in range(n)]

    # -- checkpointing -----------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the position in the stream."""
        return {
            "seed": self.seed,
            "epoch": self._epoch,
            "position": self._position,
            "excluded": None if self._excluded is None else list(self._excluded),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`get_state` snapshot (restore the curriculum's state separately)."""
        if int(state["seed"]) != self.seed:
            raise ValueError(f"PromptIterator.set_state: state is for seed {state['seed']}, iterator has {self.seed}")
        excluded = state["excluded"]
        if excluded is not None:
            unknown = [i for i in excluded if i not in self._by_id]
            if unknown:
                raise ValueError(f"PromptIterator.set_state: excluded ids not in the problem set: {unknown[:5]}")
        self._epoch, self._position = int(state["epoch"]), int(state["position"])
        self._excluded = None if excluded is None else [int(i) for i in excluded]
        self._order = None
        if self._excluded is not None:
            self._build_epoch()
            if self._position > len(self._order):
                raise ValueError(
                    f"PromptIterator.set_state: position {self._position} is past the epoch size {len(self._order)}"
                )


class MixtureIterator:
    """Training problems of several tasks (``Problem.task``) in fixed proportions: one :class:`PromptIterator` per
    task (its own shuffled epochs, seeded from ``(seed, task)``), interleaved by a deterministic quota schedule.

    The k-th prompt comes from the task whose quota ``k * weight`` is furthest ahead of the prompts it has had so
    far (ties go to the first task in sorted order), so any run of n consecutive prompts holds ``n * weight``
    prompts of each task, within one; a batch of 16 at weight 0.5 is 8 + 8. The state (``counts`` per task and each
    task iterator's own state) is JSON and restores the exact next prompt, like :class:`PromptIterator`'s."""

    def __init__(self, problems: Sequence[Problem], weights: dict[str, float], seed: int,
                 curriculum: Curriculum | None = None) -> None:
        by_task: dict[str, list[Problem]] = {}
        for p in problems:
            by_task.setdefault(p.task, []).append(p)
        if set(by_task) != set(weights):
            raise ValueError(f"MixtureIterator: weights for tasks {sorted(weights)} but problems of tasks "
                             f"{sorted(by_task)}")
        if any(w <= 0 for w in weights.values()) or abs(sum(weights.values()) - 1.0) > 1e-9:
            raise ValueError(f"MixtureIterator: weights must be > 0 and sum to 1, got {weights}")
        self.seed = int(seed)
        self.tasks = sorted(weights)
        self.weights = {t: float(weights[t]) for t in self.tasks}
        self.iters = {t: PromptIterator(by_task[t], task_seed(self.seed, t), curriculum) for t in self.tasks}
        self.counts = dict.fromkeys(self.tasks, 0)

    def next_task(self) -> str:
        """The task the next prompt will come from."""
        k = sum(self.counts.values()) + 1
        return max(self.tasks, key=lambda t: (k * self.weights[t] - self.counts[t], -self.tasks.index(t)))

    def __iter__(self) -> MixtureIterator:
        return self

    def __next__(self) -> Problem:
        t = self.next_task()
        p = next(self.iters[t])
        self.counts[t] += 1
        return p

    def next_batch(self, n: int) -> list[Problem]:
        """The next ``n`` problems."""
        return [next(self) for _ in range(n)]

    def get_state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: the per-task counts and every task iterator's state."""
        return {"seed": self.seed, "counts": dict(self.counts),
                "tasks": {t: it.get_state() for t, it in self.iters.items()}}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`get_state` snapshot (restore the curriculum's state separately)."""
        if "tasks" not in state or sorted(state["tasks"]) != self.tasks:
            raise ValueError(f"MixtureIterator.set_state: state is for tasks {sorted(state.get('tasks', {}))}, "
                             f"iterator has {self.tasks}")
        for t in self.tasks:
            self.iters[t].set_state(state["tasks"][t])
        self.counts = {t: int(state["counts"][t]) for t in self.tasks}


def task_seed(seed: int, task: str) -> int:
    """The seed of one task's prompt stream in a mixture (a 31-bit integer derived from ``(seed, task)``)."""
    return int(np.random.SeedSequence([int(seed), *task.encode()]).generate_state(1)[0] >> 1)


@dataclass(frozen=True)
class PromptData:
    """Training problems (iterate with :meth:`train_iterator`) and the held-out validation set (fixed order).

    ``weights`` (None: one task) maps each task of a multi-task run (``Problem.task``) to its share of the training
    prompts; the validation set then holds every task's held-out problems."""

    train: list[Problem]
    val: list[Problem]
    seed: int = 0
    weights: dict[str, float] | None = None

    @property
    def tasks(self) -> list[str]:
        """The tasks of the validation and training problems, sorted (``["math"]``, ``["code", "math"]``)."""
        return sorted({p.task for p in (*self.train, *self.val)})

    def train_iterator(self, curriculum: Curriculum | None = None, seed: int | None = None
                       ) -> PromptIterator | MixtureIterator:
        """A fresh iterator over the training problems: a :class:`MixtureIterator` when ``weights`` is set."""
        seed = self.seed if seed is None else seed
        if self.weights:
            return MixtureIterator(self.train, self.weights, seed, curriculum)
        return PromptIterator(self.train, seed, curriculum)

    def val_batches(self, batch_size: int) -> list[list[Problem]]:
        """The validation set in its fixed order, cut into batches (the last may be shorter)."""
        if batch_size <= 0:
            raise ValueError(f"val_batches: batch_size must be > 0, got {batch_size}")
        return [self.val[i : i + batch_size] for i in range(0, len(self.val), batch_size)]


def split_problems(problems: Sequence[Problem], val_size: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """Deterministic disjoint ``(train, val)`` split of a problem list: ``val_size`` problems chosen by ``seed``
    (validation sorted by prompt_id; training keeps the original order). Problems sharing a prompt text are
    kept on the same side, so no validation prompt is ever trained on."""
    groups: dict[str, list[Problem]] = {}
    for p in problems:
        groups.setdefault(p.prompt, []).append(p)
    keys = list(groups)
    if not 0 <= val_size < len(keys):
        raise ValueError(
            f"split_problems: val_size must be in [0, {len(keys)}) for {len(keys)} distinct prompts, got {val_size}"
        )
    perm = np.random.default_rng(np.random.SeedSequence([int(seed), _SALT + 1])).permutation(len(keys))
    val_keys = {keys[i] for i in perm[:val_size]}
    val = sorted((p for k in val_keys for p in groups[k]), key=lambda p: p.prompt_id)
    train = [p for p in problems if p.prompt not in val_keys]
    return train, val


def build_prompt_data(
    source: str,
    *,
    path: str = "",
    val_size: int = 1000,
    seed: int = 0,
    skip_malformed: bool = False,
    n_train: int | None = None,
    template: str | Callable[[str], str] = DEFAULT_TEMPLATE,
    question_key: str | None = None,
    answer_key: str | None = None,
    chain_depths: tuple[int, int] = (2, 6),
    arith_b_max: int = 99,
) -> PromptData:
    """Training and validation problems for ``source`` ``"arith"`` (the synthetic task; ``n_train`` None = all
    remaining problems), ``"chain"`` (addition chains of ``chain_depths`` = (lo, hi) additions,
    :mod:`scalerl_jax.data.chain`; ``n_train`` required) or ``"jsonl"`` (the file at ``path``; ``template`` a
    ``{question}`` string or a callable question -> prompt). Arguments mirror :class:`scalerl_jax.config.DataConfig`
    (see :func:`from_config`)."""
    if source == "arith":
        train, val = arith_split(n_train, val_size, seed, b_max=arith_b_max)
    elif source == "chain":
        if n_train is None:
            raise ValueError("build_prompt_data: source 'chain' needs n_train (the training pool size)")
        train, val = chain_split(n_train, val_size, seed, *chain_depths)
    elif source == "jsonl":
        if not path:
            raise ValueError("build_prompt_data: source 'jsonl' needs a path")
        problems, _ = load_jsonl(path, template=template, skip_malformed=skip_malformed, question_key=question_key,
                                 answer_key=answer_key)
        train, val = split_problems(problems, val_size, seed)
        if n_train is not None:
            train = train[:n_train]
    else:
        raise ValueError(f"build_prompt_data: unknown source {source!r} (expected 'arith', 'chain' or 'jsonl')")
    return PromptData(train=train, val=val, seed=seed)


def drop_long_prompts(data: PromptData, n_tokens: Callable[[Problem], int], max_len: int
                      ) -> tuple[PromptData, dict[str, int]]:
    """``data`` without the problems whose prompt has more than ``max_len`` tokens (``n_tokens(problem)``), and
    the counts dropped per split: a prompt that does not fit the prompt budget is never silently truncated."""
    keep_train = [p for p in data.train if n_tokens(p) <= max_len]
    keep_val = [p for p in data.val if n_tokens(p) <= max_len]
    counts = {"train": len(data.train) - len(keep_train), "val": len(data.val) - len(keep_val)}
    if not keep_train:
        raise ValueError(f"every one of the {len(data.train)} training prompts is longer than the prompt budget "
                         f"of {max_len} tokens (rollout.max_prompt_len)")
    if data.val and not keep_val:
        raise ValueError(f"every one of the {len(data.val)} validation prompts is longer than the prompt budget of "
                         f"{max_len} tokens (rollout.max_prompt_len)")
    return PromptData(train=keep_train, val=keep_val, seed=data.seed, weights=data.weights), counts


def code_split(source: str, *, path: str = "", val_size: int = 100, seed: int = 0, evaluate: str = "split",
               skip_malformed: bool = False, render: Callable[[str], str] | None = None
               ) -> tuple[list[Problem], list[Problem]]:
    """``(train, val)`` code problems (``task == "code"``): ``source`` ``"synthetic"`` (the tiny ``f(x)`` task,
    :mod:`scalerl_jax.data.code_synth`) or ``"jsonl"`` (CodeTask rows at ``path``, prompts through ``render``);
    validation is ``val_size`` held-out prompts (``evaluate="split"``) or HumanEval's 164 problems
    (``evaluate="humaneval"``: every row of ``path`` trains)."""
    from scalerl_jax.data.code_synth import CODE_ID_OFFSET, code_problems, fx_split
    from scalerl_jax.data.code_tasks import load_code_tasks, load_humaneval

    if source == "synthetic":
        if evaluate != "split":
            raise ValueError("code_split: the synthetic code task validates on its own held-out split, not on "
                             f"{evaluate!r}")
        return fx_split(None, val_size, seed)
    if source != "jsonl":
        raise ValueError(f"code_split: unknown code source {source!r} (expected 'synthetic' or 'jsonl')")
    if not path:
        raise ValueError("code_split: code source 'jsonl' needs a path (data.code_path)")
    tasks, _ = load_code_tasks(path, skip_malformed=skip_malformed)
    problems = code_problems(tasks, render)
    if evaluate == "humaneval":  # ids past the training file's, so the two never share one
        return problems, code_problems(load_humaneval(), render, id_offset=CODE_ID_OFFSET + len(tasks))
    if evaluate != "split":
        raise ValueError(f"code_split: unknown code evaluation {evaluate!r} (expected 'split' or 'humaneval')")
    return split_problems(problems, val_size, seed)


def with_code(data: PromptData, code_train: list[Problem], code_val: list[Problem], weight: float) -> PromptData:
    """``data`` (math) with code problems mixed in: ``weight`` of each training batch is code; validation holds
    both tasks' held-out problems (math first)."""
    if not 0.0 < weight < 1.0:
        raise ValueError(f"with_code: the code weight must be in (0, 1), got {weight}")
    if not code_train:
        raise ValueError("with_code: no code training problems")
    return PromptData(train=[*data.train, *code_train], val=[*data.val, *code_val], seed=data.seed,
                      weights={"math": 1.0 - weight, "code": weight})


def from_config(cfg, *, code_render: Callable[[str], str] | None = None, **kwargs) -> PromptData:
    """:func:`build_prompt_data` from a :class:`scalerl_jax.config.DataConfig` (``template`` may be overridden, e.g.
    by a callable that applies a chat template), with the code prompts it asks for mixed in (:func:`code_split`,
    :func:`with_code`; ``code_render`` renders a jsonl code task's prompt)."""
    kwargs.setdefault("template", cfg.template)
    data = build_prompt_data(
        cfg.source, path=cfg.path, val_size=cfg.val_size, seed=cfg.seed, skip_malformed=cfg.skip_malformed,
        n_train=cfg.n_train, question_key=cfg.question_key, answer_key=cfg.answer_key,
        chain_depths=(cfg.chain_depth_lo, cfg.chain_depth_hi), arith_b_max=cfg.arith_b_max, **kwargs
    )
    if cfg.code_source == "none":
        return data
    train, val = code_split(cfg.code_source, path=cfg.code_path, val_size=cfg.code_val_size, seed=cfg.seed,
                            evaluate=cfg.code_eval, skip_malformed=cfg.skip_malformed, render=code_render)
    return with_code(data, train, val, cfg.code_weight)
