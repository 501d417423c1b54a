"""Loader for jsonl math sets (one JSON object per line with a question and an answer).

Field names are auto-detected: the question is the first of :data:`QUESTION_KEYS` present, the reference text the
first of :data:`ANSWER_KEYS`. The gold final answer is taken from the reference text by :func:`extract_gold`:

- GSM8K (``question``/``answer``): the text after the last ``####``;
- MATH-style solutions: the text after a trailing ``The answer is:``, else the last ``\\boxed{...}``;
- otherwise the (short) answer field itself, e.g. Hugging Face MATH-500's ``answer`` column.

When a row has both a short ``answer`` and a long ``solution`` (HF MATH-500), the short one is the gold and the
long one the solution text. ``prompt_id`` is ``id_offset`` plus the 0-based line number, so ids do not move when
malformed rows are skipped; give each file of a mixture its own ``id_offset``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from scalerl_jax.config import DEFAULT_PROMPT_TEMPLATE
from scalerl_jax.data.tasks import Problem

QUESTION_KEYS = ("question", "problem", "prompt", "query", "input")
ANSWER_KEYS = ("answer", "final_answer", "solution", "output", "target")
DEFAULT_TEMPLATE = DEFAULT_PROMPT_TEMPLATE


class DataError(ValueError):
    """A malformed data row; the message starts with ``file:line``."""


def make_prompt(question: str, template: str = DEFAULT_TEMPLATE) -> str:
    """The prompt text for an instruction model: ``template`` with ``{question}`` replaced (other braces, such as
    ``\\boxed{}``, are kept literally)."""
    if "{question}" not in template:
        raise ValueError(f"make_prompt: template must contain '{{question}}', got {template!r}")
    return template.replace("{question}", question)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text`` with balanced braces, or None."""
    b, f = text.rfind("\\boxed"), text.rfind("\\fbox")
    if b < 0 and f < 0:
        return None
    i = b + len("\\boxed") if b > f else f + len("\\fbox")
    if i < len(text) and text[i] == " ":  # "\boxed 5" form: up to the next space or dollar
        j = i + 1
        while j < len(text) and text[j] not in " $":
            j += 1
        return text[i + 1 : j] or None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None  # unbalanced


def hash_answer(text: str) -> str | None:
    """GSM8K style: the first line of the text after the last ``####``, stripped, or None."""
    i = text.rfind("####")
    if i < 0:
        return None
    tail = text[i + 4 :].strip()
    return tail.splitlines()[0].strip() if tail else ""


def extract_gold(reference: str) -> str:
    """The gold final answer in a dataset's reference text (see the module docstring for the rules)."""
    h = hash_answer(reference)
    if h is not None:
        return h
    marker = "The answer is:"
    i = reference.rfind(marker)
    if i >= 0:
        return reference[i + len(marker) :].strip()
    b = last_boxed(reference)
    if b is not None:
        return b.strip()
    return reference.strip()


def _pick(row: dict, keys: tuple[str, ...], override: str | None) -> str | None:
    if override is not None:
        return override if override in row else None
    for k in keys:
        if k in row:
            return k
    return None


def load_jsonl(
    path: str,
    *,
    source: str | None = None,
    template: str | Callable[[str], str] = DEFAULT_TEMPLATE,
    skip_malformed: bool = False,
    id_offset: int = 0,
    question_key: str | None = None,
    answer_key: str | None = None,
) -> tuple[list[Problem], int]:
    """Load a jsonl math set as ``(problems, n_skipped)``.

    ``template`` is a ``{question}`` template string or a callable ``question -> prompt``. Rows with bad JSON,
    a missing question or answer field, an empty question or an empty gold answer raise :class:`DataError`
    naming the file and 1-based line, or with ``skip_malformed=True`` are skipped and counted in ``n_skipped``.
    Blank lines are ignored. ``source`` defaults to the file name without extension.
    """
    if source is None:
        source = os.path.splitext(os.path.basename(path))[0]
    to_prompt = template if callable(template) else (lambda q: make_prompt(q, template))
    problems: list[Problem] = []
    n_skipped = 0
    with open(path, encoding="utf-8") as f:
        for idx, line in enumerate(f):
            if not line.strip():
                continue
            try:
                problems.append(_parse_row(line, idx, id_offset, source, to_prompt, question_key, answer_key))
            except DataError as e:
                if not skip_malformed:
                    raise DataError(f"{path}:{idx + 1}: {e}") from None
                n_skipped += 1
    return problems, n_skipped


def _parse_row(line, idx, id_offset, source, to_prompt, question_key, answer_key) -> Problem:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise DataError(f"expected a JSON object, got {type(row).__name__}")
    qk = _pick(row, QUESTION_KEYS, question_key)
    if qk is None:
        raise DataError(f"no question field (looked for {question_key or QUESTION_KEYS}); keys: {sorted(row)} "
                        "(set data.question_key to the row's question field)")
    ak = _pick(row, ANSWER_KEYS, answer_key)
    if ak is None:
        raise DataError(f"no answer field (looked for {answer_key or ANSWER_KEYS}); keys: {sorted(row)} "
                        "(set data.answer_key to the row's answer field)")
    question, reference = row[qk], row[ak]
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"empty or non-string question in field {qk!r}")
    if isinstance(reference, int | float) and not isinstance(reference, bool):
        reference = str(reference)
    if not isinstance(reference, str):
        raise DataError(f"non-string answer in field {ak!r}")
    gold = extract_gold(reference)
    if not gold:
        raise DataError(f"empty gold answer in field {ak!r}")
    solution = reference
    if ak == "answer" and isinstance(row.get("solution"), str) and row["solution"].strip():
        solution = row["solution"]
    return Problem(prompt_id=id_offset + idx, prompt=to_prompt(question), answer=gold, solution=solution, source=source)
