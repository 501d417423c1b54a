"""Reward functions: exact match for the synthetic arithmetic task, math-verify for real math sets, the sandboxed
code reward for code problems.

Every scorer returns ``(rewards, counts)``: a float32 array of +1/-1 and a dict with at least ``"timeouts"`` and
``"no_answer"``. :func:`score` dispatches on each problem: code (``problem.code`` set), the synthetic tasks with an
exact answer (``source`` in :data:`EXACT_MATCH_SOURCES`: ``"arith"``, ``"chain"``), or anything else = math.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scalerl_jax.data.tasks import Problem
from scalerl_jax.rewards.arith import EXACT_MATCH_SOURCES, arith_reward, extract_arith_answer, score_arith
from scalerl_jax.rewards.length_penalty import length_penalty
from scalerl_jax.rewards.math import (
    MathVerifier,
    completion_answer_text,
    default_verifier,
    math_reward,
    score_math,
)


def _score_code(completions: Sequence[str], problems: Sequence[Problem], pool) -> tuple[np.ndarray, dict[str, int]]:
    from scalerl_jax.data.code_synth import program_text
    from scalerl_jax.rewards.code import score_code

    texts = [program_text(c, p) for c, p in zip(completions, problems, strict=True)]
    rewards, counts = score_code(texts, [p.code for p in problems], pool)
    counts["sandbox_errors"] = counts["sandbox_error"]
    return rewards, counts


def score(
    completions: Sequence[str], problems: Sequence[Problem], verifier: MathVerifier | None = None,
    code_pool=None,
) -> tuple[np.ndarray, dict[str, int]]:
    """+1/-1 rewards for paired completions and problems, and counts ``{"timeouts", "no_answer"}`` (and
    ``"sandbox_errors"`` when code problems were scored).

    Code problems (``problem.code`` set) run their program in the code sandbox through ``code_pool`` (a
    :class:`~scalerl_jax.rewards.code_pool.CodePool`; None: the process-wide default pool, isolation ``auto``);
    the program is the text after the last ``#`` for the synthetic task, else the completion's code block.
    Synthetic arithmetic problems (``source`` ``"arith"`` or ``"chain"``) use the exact-match verifier; all others
    math-verify (``verifier`` or the process-wide :func:`default_verifier`, started only when needed).
    """
    if len(completions) != len(problems):
        raise ValueError(f"score: {len(completions)} completions for {len(problems)} problems")
    rewards = np.empty(len(completions), np.float32)
    counts = {"timeouts": 0, "no_answer": 0}
    code = [k for k, p in enumerate(problems) if p.code is not None]
    arith = [k for k, p in enumerate(problems) if p.code is None and p.source in EXACT_MATCH_SOURCES]
    other = [k for k, p in enumerate(problems) if p.code is None and p.source not in EXACT_MATCH_SOURCES]
    for idx, fn in ((arith, score_arith), (other, lambda c, p: score_math(c, p, verifier)),
                    (code, lambda c, p: _score_code(c, p, code_pool))):
        if not idx:
            continue
        r, c = fn([completions[k] for k in idx], [problems[k] for k in idx])
        rewards[idx] = r
        for key in ("timeouts", "no_answer", "sandbox_errors"):
            if key in c:
                counts[key] = counts.get(key, 0) + c[key]
    return rewards, counts


__all__ = [
    "EXACT_MATCH_SOURCES",
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
