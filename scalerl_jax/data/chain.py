"""Addition chains of variable depth: a task where length and difficulty grow together.

A problem of depth ``d`` adds ``d + 1`` single-digit operands (1..9) left to right; its target completion keeps a
running total, one step per ``;``, then the thinking marker ``#`` and the answer:

    prompt      "3+4+5+9="                 (depth 3)
    completion  "3+4=7;7+5=12;12+9=21#21"  (followed by <eos>)

The scratchpad grows by 5 to 7 characters per step, so the deepest problems need more thinking tokens than a small
thinking budget allows (interruption and the length penalty then act on them), and every step is one more chance
of a slip (deeper is harder). Only the 17 symbols of the tiny task's character tokenizer are used.

Prompt ids are stable: depth ``d``'s problems occupy ``[offset(d), offset(d) + 9 ** (d + 1))`` with
``offset(d) = sum of 9 ** (k + 1) for 1 <= k < d``, and a problem's index within its depth is its operands read as
base-9 digits (operand - 1). Two problems share an id exactly when they are the same problem, whatever the seed.

:func:`chain_split` draws one seeded stream of distinct problems, each draw's depth uniform over ``[depth_lo,
depth_hi]`` and its operands uniform (repeats are skipped, so once a shallow depth's small space - 729 problems at
depth 2 - fills up, later problems are deeper); the first ``n_val`` are validation and the next ``n_train``
training, so the split is disjoint and a larger ``n_train`` extends a smaller one (the supervised warm start's pool
holds the RL pool).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from scalerl_jax.data.tasks import THINK_MARKER, Problem

OPERAND_RANGE = (1, 9)
_BASE = OPERAND_RANGE[1] - OPERAND_RANGE[0] + 1  # 9
MAX_DEPTH = 16  # ids stay far inside int64 (9 ** 17 ~ 1.7e16)
_SALT = 0x43484149  # "CHAI": separates this task's stream from other users of the seed
_CHUNK = 1024


def _check_depth(d: int, where: str) -> None:
    if not 1 <= d <= MAX_DEPTH:
        raise ValueError(f"{where}: depth must be in [1, {MAX_DEPTH}], got {d}")


def depth_offset(d: int) -> int:
    """First prompt id of depth ``d`` (the ids of all shallower depths come before it)."""
    _check_depth(d, "depth_offset")
    return sum(_BASE ** (k + 1) for k in range(1, d))


def chain_id(operands: Sequence[int]) -> int:
    """Stable prompt id of the chain ``operands[0] + operands[1] + ...`` (depth ``len(operands) - 1``)."""
    d = len(operands) - 1
    _check_depth(d, "chain_id")
    idx = 0
    for x in operands:
        if not OPERAND_RANGE[0] <= x <= OPERAND_RANGE[1]:
            raise ValueError(f"chain_id: operand {x} is outside {OPERAND_RANGE} in {list(operands)}")
        idx = idx * _BASE + (int(x) - OPERAND_RANGE[0])
    return depth_offset(d) + idx


def chain_operands(prompt_id: int) -> list[int]:
    """Inverse of :func:`chain_id`."""
    pid = int(prompt_id)
    for d in range(1, MAX_DEPTH + 1):
        size = _BASE ** (d + 1)
        off = depth_offset(d)
        if off <= pid < off + size:
            idx, digits = pid - off, []
            for _ in range(d + 1):
                idx, r = divmod(idx, _BASE)
                digits.append(r + OPERAND_RANGE[0])
            return digits[::-1]
    raise ValueError(f"chain_operands: id {prompt_id} is not a chain id (depth 1..{MAX_DEPTH})")


def chain_solution(operands: Sequence[int]) -> tuple[str, int]:
    """The running scratchpad and final total: ``("3+4=7;7+5=12", 12)`` for ``[3, 4, 5]``."""
    total, steps = int(operands[0]), []
    for x in operands[1:]:
        steps.append(f"{total}+{x}={total + x}")
        total += int(x)
    return ";".join(steps), total


def chain_problem(operands: Sequence[int]) -> Problem:
    """The problem ``a+b+c+...=`` with its scratchpad target ``a+b=X;X+c=Y;...#Z`` (source ``"chain"``)."""
    pid = chain_id(operands)
    thinking, total = chain_solution(operands)
    return Problem(prompt_id=pid, prompt="+".join(str(x) for x in operands) + "=", answer=str(total),
                   solution=f"{thinking}{THINK_MARKER}{total}", source="chain")


def chain_depth(problem: Problem) -> int:
    """Depth (number of additions) of a chain problem."""
    return problem.prompt.count("+")


def thinking_len(problem: Problem) -> int:
    """Characters (= tokens of the character tokenizer) of the target's thinking, before the ``#``."""
    return len(problem.solution.rsplit(THINK_MARKER, 1)[0])


def _stream(n: int, depth_lo: int, depth_hi: int, seed: int) -> list[Problem]:
    _check_depth(depth_lo, "chain_split")
    _check_depth(depth_hi, "chain_split")
    if depth_lo > depth_hi:
        raise ValueError(f"chain_split: depth_lo {depth_lo} > depth_hi {depth_hi}")
    space = sum(_BASE ** (d + 1) for d in range(depth_lo, depth_hi + 1))
    if n > space // 2:  # rejection sampling of distinct problems stays cheap well below the space's size
        raise ValueError(f"chain_split: {n} problems asked of depths {depth_lo}..{depth_hi}, whose space holds only "
                         f"{space}; ask for at most {space // 2}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), depth_lo, depth_hi, _SALT]))
    seen: set[int] = set()
    out: list[Problem] = []
    while len(out) < n:  # fixed-size chunks: the stream does not depend on n, so shorter streams are prefixes
        depths = rng.integers(depth_lo, depth_hi + 1, size=_CHUNK)
        ops = rng.integers(OPERAND_RANGE[0], OPERAND_RANGE[1] + 1, size=(_CHUNK, depth_hi + 1))
        for d, row in zip(depths.tolist(), ops.tolist(), strict=True):
            p = chain_problem(row[: d + 1])
            if p.prompt_id not in seen and len(out) < n:
                seen.add(p.prompt_id)
                out.append(p)
    return out


def chain_split(n_train: int, n_val: int, seed: int, depth_lo: int = 2, depth_hi: int = 8
                ) -> tuple[list[Problem], list[Problem]]:
    """Disjoint ``(train, val)`` chain sets from one seeded stream of distinct problems (see the module docstring).

    Depth is uniform over ``[depth_lo, depth_hi]``. Validation is sorted by prompt_id (a fixed order, shallow
    first); training keeps the stream order, so ``chain_split(m, ...)[0]`` starts with ``chain_split(n, ...)[0]``
    for ``m >= n``.
    """
    if n_val < 0 or n_train < 0:
        raise ValueError(f"chain_split: n_train and n_val must be >= 0, got {n_train} and {n_val}")
    problems = _stream(n_val + n_train, depth_lo, depth_hi, seed)
    return problems[n_val:], sorted(problems[:n_val], key=lambda p: p.prompt_id)
