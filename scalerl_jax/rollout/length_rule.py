"""Interruption length control's rule (RECIPE.md section 4), written once for both places that apply it: the
embedded engine's decode step (:mod:`scalerl_jax.rollout.engine.decode`, over ``jax.numpy`` arrays of slots, under jit)
and the client's interruption for servers that do not do it (:meth:`SGLangGenerator._client_interruption
<scalerl_jax.rollout.client.sglang.SGLangGenerator._client_interruption>`, over NumPy arrays of one sample's
positions, :func:`think_outcome`).

The per-row state machine::

    THINK  --(n_generated == think_budget, think_end not seen)-->  INJECT  --(all interruption ids fed)-->
    ANSWER --(stop token: "interrupted" | answer_budget sampled tokens: "length", truncated)
    THINK  --(think_end_ids just completed)-->  FREE (plain generation: "stop" or "length")

The decisions are pure functions of boolean and integer arrays that use only ``&``, ``|``, ``~``, comparisons and
``xp.where`` / ``xp.all`` (``xp`` is ``numpy`` or ``jax.numpy``): the same lines decide on the device and on the
host. Every completion is capped at ``max_new_tokens`` (injected tokens included): :func:`length_hit`. Thinking
budgets are drawn by :func:`draw_budget`, from a NumPy generator, on both sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

PH_THINK, PH_INJECT, PH_ANSWER, PH_FREE = 0, 1, 2, 3
FIN_NONE, FIN_STOP, FIN_LENGTH, FIN_INTERRUPTED = 0, 1, 2, 3
FINISH_NAMES = {FIN_STOP: "stop", FIN_LENGTH: "length", FIN_INTERRUPTED: "interrupted"}
NO_BUDGET = 2**30  # the thinking budget of a row without length control


def draw_budget(rng: np.random.Generator, lc: Any) -> int:
    """One thinking budget, uniform over ``[lc.budget_lo, lc.budget_hi]``."""
    return int(rng.integers(lc.budget_lo, lc.budget_hi + 1))


def think_end_matches(xp: Any, window: Any, think_end: Any, mask: Any) -> Any:
    """Whether the newest tokens (``window[..., W]``, right-aligned, -1 where there are none yet) end with
    ``think_end`` (right-aligned; ``mask`` marks its real entries)."""
    return xp.all((window == think_end) | ~mask, axis=-1)


def think_events(thinking: Any, think_end_hit: Any, is_stop: Any, n_gen: Any, budget: Any) -> tuple[Any, Any]:
    """While thinking, after the token that makes ``n_gen`` tokens: (thinking ended: ``think_end_ids`` just
    completed -> FREE; the budget ran out -> INJECT). A stop token or the end of thinking wins over the budget."""
    ended = thinking & think_end_hit
    budget_hit = thinking & ~think_end_hit & ~is_stop & (n_gen >= budget)
    return ended, budget_hit


def length_hit(active: Any, is_stop: Any, answering: Any, ans: Any, ans_budget: Any, n_gen: Any,
               max_new: Any) -> Any:
    """The row ends for length: ``ans_budget`` answer tokens after an interruption (``answering``: the row is in
    ANSWER after this token), or ``max_new`` tokens in all. A stop token wins."""
    return active & ~is_stop & ((answering & (ans >= ans_budget)) | (n_gen >= max_new))


def stop_finish(xp: Any, phase: Any) -> Any:
    """Finish code of a stop token sampled in ``phase``: a stop while answering after an interruption counts as
    interrupted."""
    return xp.where(phase == PH_ANSWER, FIN_INTERRUPTED, FIN_STOP)


def think_outcome(tokens: Sequence[int], stopped: bool, think_end_ids: Sequence[int], budget: int,
                  max_new: int) -> tuple[str, int]:
    """The thinking phase of the state machine replayed over ``tokens`` sampled without interruption (the
    client's first round; ``stopped``: they ended with a stop token). Returns (event, n), n tokens kept:

    - ``"stop"``: a stop token at n while thinking (or as thinking ended);
    - ``"length"``: ``max_new`` tokens reached at n (over an interruption due at the same token);
    - ``"think_end"``: thinking ended at n: plain generation from there;
    - ``"interrupt"``: the budget ran out at n = ``budget``: the interruption ids come next;
    - ``"open"``: none of these within ``tokens``.
    """
    T, W = len(tokens), len(think_end_ids)
    if T == 0:
        return "open", 0
    padded = np.concatenate([np.full(W - 1, -1, np.int64), np.asarray(tokens, np.int64)])
    window = np.lib.stride_tricks.sliding_window_view(padded, W)  # [T, W]: the newest W tokens after each token
    matches = think_end_matches(np, window, np.asarray(think_end_ids, np.int64), np.ones(W, bool))
    thinking = np.ones(T, bool)  # nothing before the first event leaves THINK
    n_gen = np.arange(1, T + 1)
    is_stop = np.zeros(T, bool)
    is_stop[-1] = stopped
    ended, budget_hit = think_events(thinking, matches, is_stop, n_gen, budget)
    cap = length_hit(thinking, is_stop, np.zeros(T, bool), 0, 0, n_gen, max_new)
    first = is_stop | cap | ended | budget_hit
    if not first.any():
        return "open", T
    t = int(np.argmax(first))
    event = "stop" if is_stop[t] else "length" if cap[t] else "think_end" if ended[t] else "interrupt"
    return event, t + 1
