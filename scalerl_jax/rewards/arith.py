"""Exact-match verifier of the synthetic arithmetic tasks (``a+b*c`` and the addition chains): +1 when the text after
the last ``#`` is the answer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scalerl_jax.data.tasks import Problem, split_thinking

_SPECIAL = ("<eos>", "<pad>")
#: Problem.source values scored by exact match (the tiny task and the addition chains of scalerl_jax.data.chain)
EXACT_MATCH_SOURCES = ("arith", "chain")


def _clean(completion: str) -> str:
    # A decoded completion may still carry rendered special tokens; everything from the first eos on is not part
    # of the answer, and pads carry no text.
    i = completion.find("<eos>")
    if i >= 0:
        completion = completion[:i]
    for s in _SPECIAL:
        completion = completion.replace(s, "")
    return completion.strip()


def extract_arith_answer(completion: str) -> str | None:
    """The text after the last ``#`` (eos/pad stripped), or None when the completion has no ``#``."""
    return split_thinking(_clean(completion))[1]


def arith_reward(completion: str, answer: str) -> float:
    """+1.0 when the text after the last ``#`` equals ``answer`` exactly, else -1.0."""
    return 1.0 if extract_arith_answer(completion) == answer else -1.0


def score_arith(completions: Sequence[str], problems: Sequence[Problem]) -> tuple[np.ndarray, dict[str, int]]:
    """Rewards (float32, +1/-1) for paired completions and problems, and counts ``{"no_answer", "timeouts"}``
    (``timeouts`` is always 0; it is there so every scorer reports the same keys)."""
    if len(completions) != len(problems):
        raise ValueError(f"score_arith: {len(completions)} completions for {len(problems)} problems")
    rewards = np.empty(len(completions), np.float32)
    no_answer = 0
    for k, (c, p) in enumerate(zip(completions, problems, strict=True)):
        ans = extract_arith_answer(c)
        no_answer += ans is None
        rewards[k] = 1.0 if ans == p.answer else -1.0
    return rewards, {"no_answer": no_answer, "timeouts": 0}
