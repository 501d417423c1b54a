"""Problems and the synthetic arithmetic task of the tiny default.

A problem is ``a+b*c=`` with a in 0..99, b in 2..99, c in 2..9 (100 * 98 * 8 = 78,400 distinct problems). Its
target completion writes a one-line scratchpad, then the thinking marker ``#``, then the answer:

    prompt      "7+12*3="
    completion  "12*3=36;7+36=43#43"   (followed by <eos>)

The text before the last ``#`` is thinking, the text after it is the answer (see :func:`split_thinking`).
An arithmetic problem's ``prompt_id`` encodes its triple, ``a * 784 + (b - 2) * 8 + (c - 2)``, so ids are stable
across seeds and splits and two problems share an id exactly when they are the same problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

THINK_MARKER = "#"

A_RANGE = (0, 99)
B_RANGE = (2, 99)
C_RANGE = (2, 9)
_NA = A_RANGE[1] - A_RANGE[0] + 1
_NB = B_RANGE[1] - B_RANGE[0] + 1
_NC = C_RANGE[1] - C_RANGE[0] + 1
ARITH_SPACE = _NA * _NB * _NC  # 78,400


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    ``prompt`` is the exact text given to the model; ``answer`` the gold final answer (what the verifier compares
    against); ``solution`` a full target completion (the supervised warm-start target; for jsonl sets, the
    dataset's reference solution text); ``source`` names the data set (``"arith"``, ``"math500"``, ``"fx"``, ...).
    ``task`` is the task family a multi-task run reports separately (``"math"`` or ``"code"``: the eval row's
    ``val_reward_<task>``); ``code`` is a code problem's :class:`~scalerl_jax.data.code_tasks.CodeTask` (its tests,
    entry point and code prefix; None for math).
    """

    prompt_id: int
    prompt: str
    answer: str
    solution: str
    source: str
    task: str = "math"
    code: Any = None


def split_thinking(text: str) -> tuple[str, str | None]:
    """Split a completion at the last ``#``: ``(thinking, answer)``; ``answer`` is None when there is no ``#``."""
    i = text.rfind(THINK_MARKER)
    if i < 0:
        return text, None
    return text[:i], text[i + 1 :]


def arith_id(a: int, b: int, c: int) -> int:
    """Stable prompt id of the triple ``(a, b, c)``."""
    if not (A_RANGE[0] <= a <= A_RANGE[1] and B_RANGE[0] <= b <= B_RANGE[1] and C_RANGE[0] <= c <= C_RANGE[1]):
        raise ValueError(f"arith_id: ({a}, {b}, {c}) is outside a in {A_RANGE}, b in {B_RANGE}, c in {C_RANGE}")
    return ((a - A_RANGE[0]) * _NB + (b - B_RANGE[0])) * _NC + (c - C_RANGE[0])


def arith_triple(prompt_id: int) -> tuple[int, int, int]:
    """Inverse of :func:`arith_id`."""
    if not 0 <= prompt_id < ARITH_SPACE:
        raise ValueError(f"arith_triple: id {prompt_id} is outside [0, {ARITH_SPACE})")
    rest, c = divmod(int(prompt_id), _NC)
    a, b = divmod(rest, _NB)
    return a + A_RANGE[0], b + B_RANGE[0], c + C_RANGE[0]


def arith_problem(a: int, b: int, c: int) -> Problem:
    """The problem ``a+b*c=`` with its scratchpad solution ``b*c=X;a+X=Y#Y``."""
    pid = arith_id(a, b, c)
    x = b * c
    y = a + x
    return Problem(
        prompt_id=pid,
        prompt=f"{a}+{b}*{c}=",
        answer=str(y),
        solution=f"{b}*{c}={x};{a}+{x}={y}{THINK_MARKER}{y}",
        source="arith",
    )


def _permuted_ids(seed: int) -> np.ndarray:
    return np.random.default_rng(np.random.SeedSequence([int(seed), 0x41524954])).permutation(ARITH_SPACE)


def arith_problems(n: int, seed: int) -> list[Problem]:
    """``n`` distinct arithmetic problems drawn deterministically from ``seed`` (without replacement).

    These are the first ``n`` of the same permutation :func:`arith_split` uses, i.e. that split's validation
    problems come first: take warm-start or training data from ``arith_split(...)[0]``, not from here.
    """
    if not 0 <= n <= ARITH_SPACE:
        raise ValueError(f"arith_problems: n must be in [0, {ARITH_SPACE}], got {n}")
    return [arith_problem(*arith_triple(int(i))) for i in _permuted_ids(seed)[:n]]


def arith_split(n_train: int | None, n_val: int, seed: int,
                b_max: int = B_RANGE[1]) -> tuple[list[Problem], list[Problem]]:
    """Disjoint ``(train, val)`` arithmetic sets from one seeded permutation of the problem space (the triples with
    ``b <= b_max``; the default keeps all of them).

    The first ``n_val`` problems of the permutation are validation, the next ``n_train`` (all the rest when
    None) are training, so no validation triple can ever appear in training. Validation is sorted by prompt_id
    (a fixed order); training keeps the permutation order.
    """
    if not B_RANGE[0] <= b_max <= B_RANGE[1]:
        raise ValueError(f"arith_split: b_max must be in [{B_RANGE[0]}, {B_RANGE[1]}], got {b_max}")
    ids = _permuted_ids(seed)
    if b_max < B_RANGE[1]:
        ids = ids[(ids // _NC) % _NB + B_RANGE[0] <= b_max]
    space = len(ids)
    n_rest = space - n_val
    if n_val < 0 or n_rest < 0:
        raise ValueError(f"arith_split: n_val must be in [0, {space}], got {n_val}")
    if n_train is None:
        n_train = n_rest
    if not 0 <= n_train <= n_rest:
        raise ValueError(f"arith_split: n_train + n_val must be <= {space}, got {n_train} + {n_val}")
    val = [arith_problem(*arith_triple(int(i))) for i in np.sort(ids[:n_val])]
    train = [arith_problem(*arith_triple(int(i))) for i in ids[n_val : n_val + n_train]]
    return train, val
