"""Word-problem arithmetic: the tiny task's ``a + b * c`` rendered as English question/answer rows with a
``\\boxed{}`` final answer, written as jsonl (the ``small`` preset's data, loaded by the same
:func:`~scalerl_jax.data.jsonl.load_jsonl` and scored by the same math-verify reward as any real math set).

    question  "Mia has 7 pens and buys 12 boxes of 3. How many pens now?"
    answer    "12*3=36. 7+36=43. \\boxed{43}"

The problem space is the tiny task's (a in 0..99, b in 2..99, c in 2..9), each triple under one of several
phrasings chosen by the triple itself, so a triple has exactly one question text and the train/validation split
(:func:`~scalerl_jax.data.pipeline.split_problems`, by prompt text) never leaks a triple.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from scalerl_jax.data.tasks import ARITH_SPACE, arith_triple

_NAMES = ["Mia", "Tom", "Ava", "Leo", "Zoe", "Sam"]
_ITEMS = [("pens", "box", "boxes"), ("apples", "bag", "bags"), ("stamps", "page", "pages"),
          ("cards", "pack", "packs"), ("coins", "jar", "jars"), ("shells", "bucket", "buckets")]
_TEMPLATES = [
    "{name} has {a} {items} and buys {b} {boxes} of {c}. How many {items} now?",
    "A shop has {a} {items} and gets {b} {boxes} of {c}. How many {items} now?",
    "{name} has {a} {items} and gets {c} a day for {b} days. How many {items} now?",
]


def question_text(a: int, b: int, c: int, pid: int) -> str:
    """The English question of triple ``(a, b, c)`` with id ``pid`` (its phrasing is a function of the id)."""
    name = _NAMES[pid % len(_NAMES)]
    items, _, boxes = _ITEMS[(pid // len(_NAMES)) % len(_ITEMS)]
    t = _TEMPLATES[(pid // (len(_NAMES) * len(_ITEMS))) % len(_TEMPLATES)]
    return t.format(name=name, items=items, boxes=boxes, a=a, b=b, c=c)


def solution_text(a: int, b: int, c: int) -> str:
    """The worked answer: the product, the sum, then the boxed result."""
    x = b * c
    return f"{b}*{c}={x}. {a}+{x}={a + x}. \\boxed{{{a + x}}}"


def box_the_product(solution: str) -> str:
    """The solution with the product boxed instead of the result (``"12*3=36. 7+36=43. \\boxed{36}"``): every step
    worked, then the wrong number committed to, which the math-verify reward scores as wrong. The ``small`` preset's
    warm start trains on a share of these so that its policy often boxes the wrong number: what RL has to unlearn
    (the word-problem twin of the tiny task's unmarked answers)."""
    product = solution.split("=", 1)[1].split(".", 1)[0]
    head, _, _ = solution.rpartition("\\boxed{")
    return f"{head}\\boxed{{{product}}}"


def word_arith_rows(n: int, seed: int, b_max: int = 99) -> list[dict]:
    """``n`` distinct problems with ``b <= b_max`` (without replacement, drawn by ``seed``) as ``{"id", "question",
    "answer"}`` rows. ``b_max=19`` keeps the products within a small multiplication table (14,400 problems)."""
    space = [pid for pid in range(ARITH_SPACE) if arith_triple(pid)[1] <= b_max]
    if not 0 < n <= len(space):
        raise ValueError(f"word_arith_rows: n must be in [1, {len(space)}] for b_max={b_max}, got {n}")
    perm = np.random.default_rng(np.random.SeedSequence([int(seed), 0x574F5244])).permutation(len(space))[:n]
    rows = []
    for pid in (space[i] for i in perm.tolist()):
        a, b, c = arith_triple(pid)
        rows.append({"id": pid, "question": question_text(a, b, c, pid), "answer": solution_text(a, b, c)})
    return rows


def write_jsonl(rows: Iterable[dict], path: str | Path) -> Path:
    """Write rows as jsonl (atomically: a temporary file renamed into place). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tmp.replace(path)
    return path


def corpus(rows: Sequence[dict], template: str) -> list[str]:
    """The text a tokenizer for these rows is trained on: every prompt (``template`` applied) and answer."""
    from scalerl_jax.data.jsonl import make_prompt

    texts = []
    for r in rows:
        texts.append(make_prompt(r["question"], template))
        texts.append(r["answer"])
        texts.append(box_the_product(r["answer"]))
    return texts
