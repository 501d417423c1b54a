"""The run's length budgets, one source of truth: every length the run allocates follows from the rollout flags.

    training row     rollout.max_prompt_len + rollout.max_new_tokens (:func:`row_len`, also
                     :attr:`ExperimentPlan.seq_len`): the train batch's rows and the generators' KV caches; at most
                     the model's ``max_seq_len``
    completion       rollout.max_new_tokens >= length.think_budget_hi + the interruption text + answer_budget
    prompt           rollout.max_prompt_len, a number or ``auto``: the longest prompt of the data after templating,
                     capped at what the model's context leaves (:func:`prompt_cap`); prompts over the budget are
                     dropped and counted, never truncated

A run settles its lengths once, in one call, as soon as the base model's config, its tokenizer and the rendered
prompts are at hand (:func:`settle`: the row fits the model's context, ``length.think_end="auto"`` resolved from the
tokenizer, the interruption length control built, the completion budget checked with the interruption text's
tokens, the prompts measured, the prompt budget resolved and the longer prompts dropped). The dry run, which has no
tokenizer, checks the same rules without the interruption text (:func:`check_config`). Each check
that fails names the flag(s) to change and by how much. Data that leaves no training prompt or no validation prompt
under the budget is refused with the counts. The field checks of the config and ``completion_budget_error`` (the
rule the engine and the server apply to each request) live in ``scalerl_jax/config.py``. :class:`ThinkEndWatch`
warns when interruption is on but no sample of the first batches writes ``think_end`` itself (a model that does not
think in those markers).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scalerl_jax.config import (
    PLAIN_INTERRUPTION,
    PLAIN_THINK_END,
    THINK_INTERRUPTION,
    ConfigError,
    ExperimentConfig,
    completion_budget_error,
)

R = dataclasses.replace
AUTO = "auto"


def prompt_cap(exp: ExperimentConfig) -> int:
    """The longest prompt the model's context leaves room for: ``model.max_seq_len - rollout.max_new_tokens``."""
    return exp.model.max_seq_len - exp.rollout.max_new_tokens


def row_len(exp: ExperimentConfig) -> int:
    """Tokens per training row: ``rollout.max_prompt_len + rollout.max_new_tokens``, the one source of every length
    the run allocates (train batch, generator KV caches). ``max_prompt_len="auto"`` is measured from the data when
    the run loads it (:func:`resolve_prompt_budget`); before that there is no row length."""
    ro = exp.rollout
    if ro.max_prompt_len == AUTO:
        raise ConfigError("rollout.max_prompt_len=auto has no value before the data is measured")
    return ro.max_prompt_len + ro.max_new_tokens


def check_row_fits_model(exp: ExperimentConfig) -> None:
    """Prompt + completion budgets fit the model's context (``model.max_seq_len``, from its config.json's
    ``max_position_embeddings``); for ``max_prompt_len=auto`` at least one prompt token must be left."""
    ro, limit = exp.rollout, exp.model.max_seq_len
    if ro.max_prompt_len == AUTO:
        if prompt_cap(exp) <= 0:
            raise ConfigError(f"rollout.max_new_tokens {ro.max_new_tokens} leaves no room for a prompt in the "
                              f"model's context of {limit} tokens (model.max_seq_len): lower --rollout.max-new-tokens "
                              f"by at least {ro.max_new_tokens - limit + 1}")
        return
    total = ro.max_prompt_len + ro.max_new_tokens
    if total > limit:
        raise ConfigError(f"rollout.max_prompt_len {ro.max_prompt_len} + rollout.max_new_tokens {ro.max_new_tokens} "
                          f"= {total} tokens per row exceeds the model's context of {limit} tokens (model.max_seq_len)"
                          f": lower --rollout.max-prompt-len or --rollout.max-new-tokens by {total - limit} in all")


def check_completion_budget(exp: ExperimentConfig, interruption_tokens: int = 0) -> None:
    """With interruption length control, ``max_new_tokens`` holds the longest thinking budget, the interruption
    text (``interruption_tokens``; 0 where no tokenizer is at hand) and the answer budget."""
    ro, lc = exp.rollout, exp.rollout.length
    if lc.kind != "interruption":
        return
    need = lc.think_budget_hi + interruption_tokens + lc.answer_budget
    if completion_budget_error(ro.max_new_tokens, lc.think_budget_hi, interruption_tokens, lc.answer_budget):
        text = f" + the interruption text's {interruption_tokens} tokens" if interruption_tokens else ""
        raise ConfigError(f"rollout.max_new_tokens {ro.max_new_tokens} is below rollout.length.think_budget_hi "
                          f"{lc.think_budget_hi}{text} + rollout.length.answer_budget {lc.answer_budget} = {need}: "
                          f"raise --rollout.max-new-tokens by {need - ro.max_new_tokens} (to {need}) or lower "
                          "--rollout.length.think-budget-hi / --rollout.length.answer-budget by as much")


def resolve_prompt_budget(exp: ExperimentConfig, lengths: Sequence[int]) -> tuple[int, str]:
    """The prompt budget for prompts of ``lengths`` tokens (all of the data, after templating, with the bos the
    generator adds): ``rollout.max_prompt_len`` when it is a number; for ``auto`` the longest prompt, capped at the
    model's context less ``max_new_tokens`` (longer prompts are then dropped and counted). Returns (budget, rule)."""
    ro = exp.rollout
    if ro.max_prompt_len != AUTO:
        return int(ro.max_prompt_len), "set"
    longest = max(lengths, default=1)
    cap = prompt_cap(exp)
    if longest <= cap:
        return longest, "auto: the longest prompt"
    return cap, f"auto: the longest prompt ({longest} tokens) capped at model.max_seq_len - max_new_tokens"


def check_usable(exp: ExperimentConfig, budget: int, train_lengths: Sequence[int], val_lengths: Sequence[int],
                 source: str) -> None:
    """At least one training and one validation prompt fit the prompt budget; else a ConfigError with the counts
    and the budget that would keep one of each."""
    n_train = sum(n <= budget for n in train_lengths)
    n_val = sum(n <= budget for n in val_lengths)
    if n_train and n_val:
        return
    what = "rollout.max_prompt_len" + (" (auto)" if exp.rollout.max_prompt_len == AUTO else "")
    counts = (f"{n_train} of {len(train_lengths)} training and {n_val} of {len(val_lengths)} validation prompts of "
              f"{source} fit {what} = {budget} tokens (prompts run {min(train_lengths + val_lengths, default=0)}-"
              f"{max(train_lengths + val_lengths, default=0)} tokens after templating)")
    if not train_lengths or not val_lengths:
        raise ConfigError(f"{counts}: the data has no {'training' if not train_lengths else 'validation'} prompts; "
                          "lower --data.val-size or bring more rows")
    need = max(min(train_lengths), min(val_lengths))
    room = prompt_cap(exp)
    fix = (f"raise --rollout.max-prompt-len by {need - budget} (to {need}) or set it to auto" if need <= room else
           f"a {need}-token prompt needs --rollout.max-new-tokens lowered by {need - room} to fit the model's "
           f"context of {exp.model.max_seq_len} tokens (model.max_seq_len), or shorter prompts (data.template)")
    raise ConfigError(f"{counts}: {fix}")


def check_split(exp: ExperimentConfig, n_prompts: int, source: str) -> None:
    """``data.val_size`` held-out prompts leave at least one of ``n_prompts`` distinct prompts to train on."""
    v = exp.data.val_size
    if v >= n_prompts:
        raise ConfigError(f"data.val_size {v} holds out every one of the {n_prompts} distinct prompts of {source}, "
                          f"leaving none to train on: lower --data.val-size below {n_prompts} (the training "
                          f"batch takes rollout.prompts_per_batch = {exp.rollout.prompts_per_batch} prompts)")


def resolve_markers(exp: ExperimentConfig, tok, log=print) -> ExperimentConfig:
    """``exp`` with ``rollout.length.think_end`` / ``interruption_text`` "auto" settled for tokenizer ``tok``:
    ``</think>`` and the paper's interruption text when the vocabulary holds ``</think>`` as one token (a model that
    thinks in ``<think>`` blocks ships it so), else the plain-text pair ``boxed`` / "... The final answer is
    \\boxed" (an instruct or base model under a template that asks for a boxed answer)."""
    lc = exp.rollout.length
    if lc.kind != "interruption" or AUTO not in (lc.think_end, lc.interruption_text):
        return exp
    think = len(tok.encode("</think>")) == 1
    end, text = ("</think>", THINK_INTERRUPTION) if think else (PLAIN_THINK_END, PLAIN_INTERRUPTION)
    new = R(lc, think_end=end if lc.think_end == AUTO else lc.think_end,
            interruption_text=text if lc.interruption_text == AUTO else lc.interruption_text)
    log(f"[length] rollout.length.think_end=auto: {new.think_end!r}, interruption text {new.interruption_text!r} "
        f"(the tokenizer {'holds' if think else 'has no'} a </think> token)")
    return R(exp, rollout=R(exp.rollout, length=new))


def length_control(exp: ExperimentConfig, encode):
    """The interruption length control of ``exp`` for a tokenizer's ``encode`` (None unless
    ``rollout.length.kind`` is ``interruption``); ``think_end`` / ``interruption_text`` must be settled
    (:func:`resolve_markers`)."""
    from scalerl_jax.rollout.protocol import LengthControl

    lc = exp.rollout.length
    if lc.kind != "interruption":
        return None
    if AUTO in (lc.think_end, lc.interruption_text):
        raise ConfigError("rollout.length.think_end / interruption_text 'auto' are settled from the tokenizer "
                          "(experiments.budgets.resolve_markers) before length control is built")
    return LengthControl(think_end_ids=tuple(encode(lc.think_end)),
                         interruption_ids=tuple(encode(lc.interruption_text)),
                         budget_lo=lc.think_budget_lo, budget_hi=lc.think_budget_hi, answer_budget=lc.answer_budget)


def check_config(exp: ExperimentConfig) -> None:
    """The rules that need no tokenizer: the row fits the model's context and the completion holds the thinking
    and answer budgets (the dry run's check; a run checks the same in :func:`settle`, with the interruption text)."""
    check_row_fits_model(exp)
    check_completion_budget(exp)


@dataclass(frozen=True)
class Settled:
    """A run's lengths, settled: ``exp`` with the reasoning markers and ``rollout.max_prompt_len`` (an ``auto``
    measured) resolved, the interruption length control (None without it), the prompts that fit and the counts."""

    exp: ExperimentConfig
    length: Any  # LengthControl | None
    data: Any  # PromptData without the prompts over the budget
    #: ``train`` / ``val`` prompts dropped, ``max_prompt_len`` (the budget applied), ``longest`` (the longest prompt
    #: before dropping, tokens) and ``rule`` ("set", or how ``auto`` decided)
    dropped: dict
    watch: Any = None  # the ThinkEndWatch of the first batches (with interruption), the trainer's on_batch hook


def settle(exp: ExperimentConfig, tok, data, log=print) -> Settled:
    """Every length rule of a run, in one call, once the base model's config (``exp.model``), its tokenizer ``tok``
    and the rendered prompts ``data`` are at hand: the row fits the model's context; the reasoning markers are
    settled for the tokenizer; the interruption length control is built and the completion holds the thinking
    budget, the interruption text's tokens and the answer budget; the prompts are measured (with the bos the
    generator adds), the prompt budget resolved (:func:`resolve_prompt_budget`), at least one training and one
    validation prompt must fit it (:func:`check_usable`) and the longer ones are dropped and counted; with
    interruption, a :class:`ThinkEndWatch` checks the first batches."""
    from scalerl_jax.data.pipeline import drop_long_prompts

    check_row_fits_model(exp)
    exp = resolve_markers(exp, tok, log=log)
    length = length_control(exp, tok.encode)
    check_completion_budget(exp, len(length.interruption_ids) if length is not None else 0)
    bos_id = getattr(tok, "bos_id", None)
    lengths: dict[int, int] = {}
    for p in (*data.train, *data.val):
        ids = tok.encode(p.prompt)
        lengths[p.prompt_id] = len(ids) + (bos_id is not None and ids[:1] != [bos_id])
    budget, rule = resolve_prompt_budget(exp, list(lengths.values()))
    check_usable(exp, budget, [lengths[p.prompt_id] for p in data.train], [lengths[p.prompt_id] for p in data.val],
                 exp.data.path or exp.data.source)
    data, dropped = drop_long_prompts(data, lambda p: lengths[p.prompt_id], budget)
    dropped = {**dropped, "max_prompt_len": budget, "longest": max(lengths.values()), "rule": rule}
    if rule != "set":
        log(f"[data] rollout.max_prompt_len=auto: {budget} tokens ({rule[len('auto: '):]}); training rows "
            f"{budget} + {exp.rollout.max_new_tokens} = {budget + exp.rollout.max_new_tokens} tokens")
    if dropped["train"] or dropped["val"]:
        log(f"[data] dropped {dropped['train']} training and {dropped['val']} validation prompts longer than "
            f"rollout.max_prompt_len = {budget} tokens (never truncated)")
    exp = R(exp, rollout=R(exp.rollout, max_prompt_len=budget))
    watch = (ThinkEndWatch(exp.rollout.length.think_end, functools.partial(tok.decode, skip_special_tokens=False),
                           log=log) if length is not None else None)
    return Settled(exp, length, data, dropped, watch)


class ThinkEndWatch:
    """An ``on_batch`` hook of :class:`~scalerl_jax.train.trainer.RLTrainer`: over the first ``batches`` trained
    batches, counts the samples that wrote ``think_end`` themselves (in their own tokens, before any interruption),
    then writes one ``"kind": "length_check"`` metrics row; with interruption on and no such sample, the row carries
    ``warning`` and the same line is logged: the model does not close its thinking with that text, so every long
    sample is cut at the thinking budget (set ``rollout.length.think_end`` for the model, docs/DATA.md)."""

    def __init__(self, think_end: str, decode: Callable[[list[int]], str], *, batches: int = 2, log=print) -> None:
        self.think_end, self.decode, self.batches, self.log = think_end, decode, batches, log
        self.seen = self.samples = self.interrupted = self.n_batches = 0
        self.metrics: Any = None  # the trainer's MetricsWriter, set once the trainer exists
        self.row: dict | None = None

    def __call__(self, step: int, rb, batch, stats) -> None:
        if self.n_batches >= self.batches:
            return
        self.n_batches += 1
        for g in rb.groups:
            for c in g:
                own = c.token_ids[:c.injected.index(True)] if c.interrupted else c.token_ids
                self.samples += 1
                self.interrupted += bool(c.interrupted)
                self.seen += self.think_end in self.decode(list(own))
        if self.n_batches == self.batches:
            self.row = {"kind": "length_check", "step": int(step), "think_end": self.think_end,
                        "samples": self.samples, "think_end_written": self.seen, "interrupted": self.interrupted}
            if not self.seen:
                self.row["warning"] = (
                    f"no sample of the first {self.batches} batches ({self.samples} samples) wrote "
                    f"rollout.length.think_end {self.think_end!r} itself; {self.interrupted} were cut at the thinking "
                    "budget. If the model does not think in these markers, set --rollout.length.think-end and "
                    "--rollout.length.interruption-text for it (docs/DATA.md: Reasoning markers)")
                self.log(f"[length] warning: {self.row['warning']}")
            if self.metrics is not None:
                self.metrics.write(self.row)
