"""Reward functions: exact match for the synthetic arithmetic task, math-verify for real math sets.

Every scorer returns ``(rewards, counts)``: a float32 array of +1/-1 and a dict with at least ``"timeouts"`` and
``"no_answer"``. :func:`score` dispatches on each problem's ``source`` (``"arith"`` or anything else = math).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scalerl_jax.data.tasks import Problem
from scalerl_jax.rewards.arith import arith_reward, extract_arith_answer, score_arith
from scalerl_jax.rewards.length_penalty import length_penalty
from scalerl_jax.rewards.math import (
    MathVerifier,
    completion_answer_text,
    default_verifier,
    math_reward,
    score_math,
)


def score(
    completions: Sequence[str], problems: Sequence[Problem], verifier: MathVerifier | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """+1/-1 rewards for paired completions and problems, and counts ``{"timeouts", "no_answer"}``.

    Arithmetic problems (``source == "arith"``) use the exact-match verifier; all others math-verify (``verifier``
    or the process-wide :func:`default_verifier`, started only when needed).
    """
    if len(completions) != len(problems):
        raise ValueError(f"score: {len(completions)} completions for {len(problems)} problems")
    rewards = np.empty(len(completions), np.float32)
    counts = {"timeouts": 0, "no_answer": 0}
    arith = [k for k, p in enumerate(problems) if p.source == "arith"]
    other = [k for k, p in enumerate(problems) if p.source != "arith"]
    for idx, fn in ((arith, score_arith), (other, lambda c, p: score_math(c, p, verifier))):
        if not idx:
            continue
        r, c = fn([completions[k] for k in idx], [problems[k] for k in idx])
        rewards[idx] = r
        for key in counts:
            counts[key] += c[key]
    return rewards, counts


__all__ = [
    "MathVerifier",
    "arith_reward",
    "completion_answer_text",
    "default_verifier",
    "extract_arith_answer",
    "length_penalty",
    "math_reward",
    "score",
    "score_arith",
    "score_math",
]
