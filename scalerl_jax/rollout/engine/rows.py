"""What the engine's scheduler (:mod:`scalerl_jax.rollout.engine`) schedules, on the host side.

A :class:`Submission` (the handle one ``JaxEngine.submit`` call returns) expands into :class:`Row` s, one per
sample, once :func:`validate_requests` has checked its requests against the engine's vocabulary and ``max_len``.
A row is written into one slot of the per-slot host arrays that mirror what the jitted decode step reads
(:mod:`scalerl_jax.rollout.engine.decode`): :func:`empty_slots` makes B empty (done) slots, :func:`copy_slots` carries
them into larger arrays when B, S or an id width grows (zero padding; the think-end window stays right-aligned: it is
matched against the newest tokens), :func:`fill_slot` writes a row's constants and initial decode state into its
slot (every field: slots are reused). A finished row becomes a :class:`Completion` (:func:`slot_completion`, or
:func:`empty_completion` for a row that never ran).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from scalerl_jax.config import completion_budget_error
from scalerl_jax.rollout.length_rule import FIN_LENGTH, FIN_NONE, NO_BUDGET, PH_FREE, PH_THINK
from scalerl_jax.rollout.protocol import Completion, GenerationRequest, LengthControl

log = logging.getLogger(__name__)


class Submission:
    """Handle of one :meth:`JaxEngine.submit <scalerl_jax.rollout.engine.JaxEngine.submit>` call; done once every
    row (``n`` per request) has finished.

    ``results[i][j]`` is request i's sample j. ``on_done(submission)`` runs once, on the thread that finished
    the last row (the stepping thread, or the one calling ``JaxEngine.abort``). ``error`` is set when the
    engine failed; :meth:`wait` then raises it.
    """

    def __init__(self, requests: list[GenerationRequest], on_done: Callable[[Submission], None] | None, seq: int):
        self.requests = requests
        self.seq = seq
        self.t_submit = time.time()
        self.results: list[list[Completion]] = [[None] * r.params.n for r in requests]  # type: ignore[list-item]
        self.error: BaseException | None = None
        self._left = sum(r.params.n for r in requests)
        self._on_done = on_done
        self._event = threading.Event()

    def done(self) -> bool:
        """Whether every row has finished (or the engine failed)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> list[list[Completion]]:
        """Block until done; ``n`` completions per request, in request order (raises the engine's error)."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"submission {self.seq} not done after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.results

    def _add(self, row: Row, comp: Completion) -> list[Submission]:
        self.results[row.req_idx][row.sample_idx] = comp
        self._left -= 1
        return [self] if self._left == 0 else []

    def _finish(self) -> None:
        if self._event.is_set():
            return
        self._event.set()
        if self._on_done is not None:
            try:
                self._on_done(self)
            except Exception:  # a caller's callback must not take the scheduler down
                log.exception("on_done callback of submission %d failed", self.seq)


@dataclass
class Row:
    """One sample of one request of a submission, as the scheduler places it in a slot."""

    sub: Submission
    req_idx: int
    sample_idx: int
    prompt: list[int]
    temperature: float
    top_p: float
    max_new: int
    stop: tuple[int, ...]
    length: LengthControl | None
    budget: int | None
    key: np.ndarray  # uint32[2]: the submission's sampling key ...
    row_idx: int  # ... folded with this (the row's index in the submission)
    t_start: float = 0.0


def validate_requests(requests: Sequence[GenerationRequest], *, vocab_size: int, max_len: int) -> None:
    """ValueError naming the request on bad input, for an engine over ``vocab_size`` token ids and ``max_len``
    cache positions per row."""
    V = vocab_size
    for i, req in enumerate(requests):
        name = f"request {i} (id {req.request_id!r})"
        prompt = [int(t) for t in req.prompt_ids]
        if not prompt:
            raise ValueError(f"{name}: prompt_ids is empty")
        bad = [t for t in prompt if not 0 <= t < V]
        if bad:
            raise ValueError(f"{name}: prompt token id {bad[0]} is outside the vocabulary [0, {V})")
        if len(prompt) > max_len:
            raise ValueError(f"{name}: prompt has {len(prompt)} tokens, longer than the engine's max_len "
                             f"{max_len}")
        sp = req.params
        if len(prompt) + sp.max_new_tokens > max_len:
            raise ValueError(f"{name}: prompt length {len(prompt)} + max_new_tokens {sp.max_new_tokens} exceeds "
                             f"the engine's max_len {max_len}")
        bad = [t for t in sp.stop_token_ids if not 0 <= t < V]
        if bad:
            raise ValueError(f"{name}: stop token id {bad[0]} is outside the vocabulary [0, {V})")
        lc = req.length
        if lc is not None:
            bad = [t for t in (*lc.think_end_ids, *lc.interruption_ids) if not 0 <= t < V]
            if bad:
                raise ValueError(f"{name}: length-control token id {bad[0]} is outside the vocabulary [0, {V})")
            err = completion_budget_error(sp.max_new_tokens, lc.budget_hi, len(lc.interruption_ids),
                                          lc.answer_budget)
            if err is not None:
                raise ValueError(f"{name}: {err}")


RIGHT_ALIGNED = ("think_end", "think_mask", "window")  # matched against the newest tokens: padding goes left


def empty_slots(B: int, stop_w: int, win_w: int, inter_w: int) -> tuple[dict, dict]:
    """Host constants and decode state of B empty slots (done: they emit nothing)."""
    consts = {
        "temp": np.zeros(B, np.float32), "top_p": np.ones(B, np.float32), "max_new": np.zeros(B, np.int32),
        "stop": np.full((B, stop_w), -1, np.int32), "budget": np.full(B, NO_BUDGET, np.int32),
        "inter_ids": np.zeros((B, inter_w), np.int32), "inter_len": np.ones(B, np.int32),
        "ans_budget": np.zeros(B, np.int32), "think_end": np.full((B, win_w), -1, np.int32),
        "think_mask": np.zeros((B, win_w), bool), "key": np.zeros((B, 2), np.uint32),
        "row_idx": np.zeros(B, np.int32),
    }
    st = {
        "tok": np.zeros(B, np.int32), "pos": np.zeros(B, np.int32), "n_gen": np.zeros(B, np.int32),
        "done": np.ones(B, bool), "phase": np.full(B, PH_FREE, np.int32), "inj_idx": np.zeros(B, np.int32),
        "ans": np.zeros(B, np.int32), "window": np.full((B, win_w), -1, np.int32),
        "finish": np.full(B, FIN_LENGTH, np.int32),
    }
    return consts, st


def copy_slots(new: dict, old: dict) -> None:
    """Copy ``old`` slot arrays into the (larger) ``new`` ones, keeping right-aligned windows right-aligned."""
    for k, a in old.items():
        if a.ndim == 1:
            new[k][: a.shape[0]] = a
        elif k in RIGHT_ALIGNED:
            new[k][: a.shape[0], new[k].shape[1] - a.shape[1]:] = a
        else:
            new[k][: a.shape[0], : a.shape[1]] = a


def fill_slot(consts: dict, st: dict, b: int, r: Row) -> None:
    """Write row ``r``'s constants and initial decode state into slot ``b`` (every field: slots are reused)."""
    W = consts["think_end"].shape[1]
    consts["temp"][b], consts["top_p"][b], consts["max_new"][b] = r.temperature, r.top_p, r.max_new
    consts["stop"][b] = -1
    consts["stop"][b, : len(r.stop)] = r.stop
    consts["key"][b], consts["row_idx"][b] = r.key, r.row_idx
    consts["budget"][b], consts["ans_budget"][b], consts["inter_len"][b] = NO_BUDGET, 0, 1
    consts["inter_ids"][b], consts["think_end"][b], consts["think_mask"][b] = 0, -1, False
    st["tok"][b], st["pos"][b], st["n_gen"][b] = r.prompt[-1], len(r.prompt) - 1, 0
    st["done"][b], st["finish"][b], st["phase"][b] = False, FIN_NONE, PH_FREE
    st["inj_idx"][b], st["ans"][b], st["window"][b] = 0, 0, -1
    if r.length is not None:
        lc = r.length
        consts["budget"][b], consts["ans_budget"][b] = r.budget, lc.answer_budget
        consts["inter_ids"][b, : len(lc.interruption_ids)] = lc.interruption_ids
        consts["inter_len"][b] = len(lc.interruption_ids)
        consts["think_end"][b, W - len(lc.think_end_ids):] = lc.think_end_ids
        consts["think_mask"][b, W - len(lc.think_end_ids):] = True
        st["phase"][b] = PH_THINK


def slot_completion(r: Row, b: int, st: dict, out: dict, fin: str, now: float) -> Completion:
    """Row ``r``'s Completion from slot ``b``: its first ``st["n_gen"][b]`` tokens in the output buffers ``out``."""
    n = int(st["n_gen"][b])
    req = r.sub.requests[r.req_idx]
    return Completion(
        request_id=req.request_id, sample_index=r.sample_idx, prompt_ids=list(r.prompt),
        token_ids=out["tok"][b, :n].tolist(), logprobs=out["lp"][b, :n].astype(float).tolist(),
        versions=out["ver"][b, :n].tolist(), injected=out["inj"][b, :n].tolist(),
        finish_reason=fin, truncated=fin == "length", think_budget=r.budget,
        timing={"submit": r.sub.t_submit, "start": r.t_start, "done": now}, meta=dict(req.meta),
    )


def empty_completion(r: Row, fin: str, now: float) -> Completion:
    """Row ``r``'s Completion without tokens (it never ran: ``max_new_tokens`` 0, or aborted while waiting)."""
    req = r.sub.requests[r.req_idx]
    return Completion(request_id=req.request_id, sample_index=r.sample_idx, prompt_ids=list(r.prompt),
                      token_ids=[], logprobs=[], versions=[], injected=[], finish_reason=fin,
                      truncated=fin == "length", think_budget=r.budget,
                      timing={"submit": r.sub.t_submit, "start": now, "done": now}, meta=dict(req.meta))
