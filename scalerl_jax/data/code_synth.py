"""Code prompts as :class:`~scalerl_jax.data.tasks.Problem` s: the synthetic code task of the tiny math+code preset,
and code task files (:mod:`scalerl_jax.data.code_tasks`) or HumanEval turned into problems.

The synthetic task (source ``"fx"``) asks for a one-line Python function from two input/output examples. The
hidden function is ``f(x) = a*x + b`` with a in 1..20 and b in 0..49 (1,000 distinct problems); the prompt shows
``f(0)`` and ``f(1)``, the target completion works out the slope, then writes the function body after the thinking
marker ``#``:

    prompt      "f(0)=7,f(1)=19:"
    completion  "19-7=12#x*12+7"     (followed by <eos>)

The text after the last ``#`` becomes ``def f(x):\\n    return <text>`` and is graded in the code sandbox by
hidden asserts at other inputs (x = 2, 3, 7, -4), so any expression that computes the same function passes
(``12*x+7``, ``x*12+7``, ``7+x*12``) and a body that only matches the two shown examples does not. Its characters
(:data:`FX_SYMBOLS`) extend the tiny arithmetic vocabulary, whose 15 symbols keep their order (ids 2..16).

Every code problem has ``task == "code"``, its :class:`~scalerl_jax.data.code_tasks.CodeTask` in ``code`` and a
``prompt_id`` of at least :data:`CODE_ID_OFFSET`, so its No-Positive-Resampling history never mixes with a math
prompt's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from scalerl_jax.data.code_tasks import CodeTask
from scalerl_jax.data.tasks import THINK_MARKER, Problem, split_thinking
from scalerl_jax.data.tokenizer import CHAR_SYMBOLS

FX_SOURCE = "fx"
FX_SYMBOLS = CHAR_SYMBOLS + "-x(),:f"  # the tiny vocabulary's 15 symbols first, in their order
FX_A = (1, 20)  # slope range
FX_B = (0, 49)  # intercept range
FX_HIDDEN_X = (2, 3, 7, -4)  # where the hidden asserts check the function
FX_PREFIX = "def f(x):\n    return "
_NB = FX_B[1] - FX_B[0] + 1
FX_SPACE = (FX_A[1] - FX_A[0] + 1) * _NB  # 1,000
CODE_ID_OFFSET = 1_000_000_000  # code prompt ids start here (math ids: arith < 78,400, jsonl = line numbers)


def fx_problem(a: int, b: int) -> Problem:
    """The synthetic code problem of ``f(x) = a*x + b`` (see the module docstring)."""
    if not (FX_A[0] <= a <= FX_A[1] and FX_B[0] <= b <= FX_B[1]):
        raise ValueError(f"fx_problem: ({a}, {b}) is outside a in {FX_A}, b in {FX_B}")
    pid = CODE_ID_OFFSET + (a - FX_A[0]) * _NB + (b - FX_B[0])
    prompt = f"f(0)={b},f(1)={a + b}:"
    body = f"x*{a}+{b}"
    tests = "".join(f"assert f({x}) == {a * x + b}\n" for x in FX_HIDDEN_X)
    task = CodeTask(task_id=f"fx/{a}/{b}", prompt=prompt, tests=tests, tag=FX_SOURCE, code_prefix=FX_PREFIX,
                    solution=body)
    return Problem(prompt_id=pid, prompt=prompt, answer=body, solution=f"{a + b}-{b}={a}{THINK_MARKER}{body}",
                   source=FX_SOURCE, task="code", code=task)


def fx_split(n_train: int | None, n_val: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """Disjoint ``(train, val)`` synthetic code problems from one seeded permutation of all :data:`FX_SPACE`
    functions: the first ``n_val`` are validation (sorted by prompt_id), the next ``n_train`` (None: all the rest)
    training."""
    if not 0 <= n_val <= FX_SPACE:
        raise ValueError(f"fx_split: n_val must be in [0, {FX_SPACE}], got {n_val}")
    rest = FX_SPACE - n_val
    n_train = rest if n_train is None else n_train
    if not 0 <= n_train <= rest:
        raise ValueError(f"fx_split: n_train + n_val must be <= {FX_SPACE}, got {n_train} + {n_val}")
    ids = np.random.default_rng(np.random.SeedSequence([int(seed), 0x46583D])).permutation(FX_SPACE)

    def make(i: int) -> Problem:
        a, b = divmod(int(i), _NB)
        return fx_problem(a + FX_A[0], b + FX_B[0])

    return [make(i) for i in ids[n_val:n_val + n_train]], [make(i) for i in np.sort(ids[:n_val])]


def code_problem(task: CodeTask, prompt_id: int, render: Callable[[str], str] | None = None) -> Problem:
    """A code task as a problem (``render`` turns the task's prompt into the model's prompt; default unchanged)."""
    return Problem(prompt_id=prompt_id, prompt=render(task.prompt) if render else task.prompt, answer="",
                   solution=task.solution, source=task.tag, task="code", code=task)


def code_problems(tasks: Sequence[CodeTask], render: Callable[[str], str] | None = None,
                  id_offset: int = CODE_ID_OFFSET) -> list[Problem]:
    """Code tasks as problems with ids ``id_offset + i`` (their order in ``tasks``)."""
    return [code_problem(t, id_offset + i, render) for i, t in enumerate(tasks)]


def program_text(completion: str, problem: Problem) -> str:
    """The part of a completion that holds a code problem's program: for the synthetic task the answer after the
    last ``#`` (empty when the completion never marks one: no program), otherwise the whole completion (its code
    block is found by :func:`~scalerl_jax.data.code_tasks.extract_program`)."""
    if problem.source != FX_SOURCE:
        return completion
    return split_thinking(completion)[1] or ""
