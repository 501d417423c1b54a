"""Turn the published layouts of the paper's data sets into the files a run reads.

    python -m scalerl_jax.data.prepare KIND IN OUT [--split NAME] [--limit N] [--stdin solve|refuse]
        [--max-tests N] [--max-test-chars N] [--overwrite]

``KIND`` names the published layout of ``IN``; ``OUT`` is a new jsonl file (an existing one is refused without
``--overwrite``):

- ``gsm8k`` (openai/gsm8k): ``question``, ``answer`` = the worked solution ending ``#### N``. The gold answer is
  ``N`` with thousands separators removed (``1,000`` -> ``1000``: math-verify would read the comma as a list).
- ``math`` (Hendrycks MATH; EleutherAI/hendrycks_math; MATH-500): ``problem``, ``solution`` with the final answer
  in its last ``\\boxed{}`` (or ``\\fbox{}``), ``level``, ``type``; a short ``answer`` field, where there is one
  (MATH-500), is the gold answer instead.
- ``polaris`` (POLARIS-Project/Polaris-Dataset-53K): ``problem``, ``answer`` (short), ``difficulty``.
- ``deepcoder`` (agentica-org/DeepCoder-Preview-Dataset and sets laid out like it): ``problem``, ``tests`` (a JSON
  string, or the decoded value), optional ``starter_code`` and ``metadata`` (a JSON string or object holding
  ``func_name``). The tests' layout depends on the source split and is recognised from its shape: a list of
  ``{"type": "stdin_stdout" | "function_call", "input", "output"[, "fn_name"]}`` (primeintellect), a list of
  ``{"testtype": "stdin" | "functional", "input", "output"}`` with ``metadata.func_name`` (lcbv5; a functional
  input is one JSON value per line, the output one JSON value), a dict ``{"inputs": [...], "outputs": [...][,
  "fn_name"]}`` (taco; a function's inputs are argument lists, its outputs usually the value wrapped in a list),
  or a list of ``{"input", "output"}`` (standard input/output).

Math kinds write the run's question/answer rows (:mod:`scalerl_jax.data.jsonl` reads them back with the same gold
answer): ``{"question", "answer", "solution"?, ...}`` plus the source's ``level``/``type`` or ``difficulty``.
``deepcoder`` writes CodeTask rows (:mod:`scalerl_jax.data.code_tasks`): ``task_id`` ``deepcoder/<row>``, ``prompt``,
``tests`` (plain asserts), ``code_prefix`` and ``tag`` ``deepcoder``. The code sandbox grades function calls, not a
process's standard input and output, so:

- a function test calls the named function (``Solution().<name>`` when the program holds LeetCode's ``class
  Solution``: a hidden ``code_prefix`` imports typing's names, as LeetCode's graders do, and defines the name as
  that call; a program defining the function itself replaces it) and compares as the sets' graders do: a tuple
  counts as a list and, for the primeintellect and taco layouts, a value equal to the single item of a list-wrapped
  expected output passes;
- a standard input/output problem is posed as a function (``--stdin solve``, the default): the prompt asks for
  ``solve(input_text) -> str`` taking the whole input and returning the whole output, and outputs compare as
  LiveCodeBench's grader compares them (stripped lines, equal as text or as numbers). ``--stdin refuse`` refuses
  such rows instead.

At most ``--max-tests`` tests per problem are kept (default 15, those with the longest inputs, as rllm's grader
keeps), and a problem whose tests source is longer than ``--max-test-chars`` (default 1,000,000) is refused. Every
refused row is counted under its reason; the summary printed at the end gives the rows read, kept and refused (with
the first rows of each reason). Exact duplicate problems are refused after the first.

Inputs: a ``.jsonl`` file, a ``.json`` file (a list of objects), a ``.parquet`` file (needs ``pyarrow``), a
directory written by ``datasets``' ``save_to_disk`` (needs ``datasets``; ``--split`` picks the split of a
DatasetDict), or a directory of such files, read recursively in name order (the original MATH release: one ``.json``
per problem). Which split is which matters: GSM8K's and MATH's ``test`` splits (``data/gsm8k_test.jsonl``,
``data/math500.jsonl``) are evaluation data; train on the ``train`` splits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl_jax.data.jsonl import DataError, extract_gold, hash_answer, last_boxed

KINDS = ("gsm8k", "math", "polaris", "deepcoder")


class PrepareError(ValueError):
    """Input that cannot be read at all (a missing library, an unknown layout); the message names the file."""


class Refused(ValueError):
    """One input row that is not converted; the message is the reason counted in the summary."""


# ---- reading the published files ---------------------------------------------------------------------------


def read_records(path: str | Path, split: str | None = None) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for every row of ``path`` (see the module docstring for the layouts); ``row`` is a
    :class:`Refused` when the row itself cannot be decoded."""
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_dict.json").is_file() or (p / "state.json").is_file():
            yield from _read_saved_dataset(p, split)
            return
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in (".json", ".jsonl", ".parquet"))
        if not files:
            raise PrepareError(f"{p}: a directory without .json, .jsonl or .parquet files (nor a datasets "
                               "save_to_disk directory)")
        for f in files:
            yield from _read_file(f, str(f.relative_to(p)), whole_file_is_row=f.suffix == ".json")
        return
    if not p.is_file():
        raise PrepareError(f"{p}: no such file or directory")
    if p.suffix not in (".json", ".jsonl", ".parquet"):
        raise PrepareError(f"{p}: unknown file type {p.suffix!r} (expected .jsonl, .json, .parquet or a directory)")
    yield from _read_file(p, p.name, whole_file_is_row=False)


def _read_file(f: Path, name: str, *, whole_file_is_row: bool) -> Iterator[tuple[str, Any]]:
    if f.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise PrepareError(f"{f}: reading parquet needs pyarrow, which is not installed (pip install pyarrow, "
                               "or export the rows as jsonl)") from None
        for i, row in enumerate(pq.read_table(f).to_pylist()):
            yield f"{name}[{i}]", row
        return
    text = f.read_text(encoding="utf-8")
    if f.suffix == ".jsonl":
        for i, line in enumerate(text.splitlines()):
            if line.strip():
                try:
                    yield f"{name}:{i + 1}", json.loads(line)
                except json.JSONDecodeError as e:
                    yield f"{name}:{i + 1}", Refused(f"invalid JSON ({e.msg})")
        return
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        yield name, Refused(f"invalid JSON ({e.msg} at line {e.lineno})")
        return
    if isinstance(value, list) and not whole_file_is_row:
        for i, row in enumerate(value):
            yield f"{name}[{i}]", row
    else:
        yield name, value


def _read_saved_dataset(p: Path, split: str | None) -> Iterator[tuple[str, Any]]:
    splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", []) if (
        p / "dataset_dict.json").is_file() else None
    if splits is not None and split not in splits:
        raise PrepareError(f"{p}: a DatasetDict with splits {splits}; choose one with --split")
    try:
        import datasets
    except ImportError:
        raise PrepareError(f"{p}: a datasets save_to_disk directory; reading it needs the datasets library, which is "
                           "not installed (pip install datasets, or export it with Dataset.to_json(FILE.jsonl))"
                           ) from None
    ds = datasets.load_from_disk(str(p))
    if splits is not None:
        ds = ds[split]
    for i, row in enumerate(ds):
        yield f"{p.name}[{i}]", row


# ---- math sets ---------------------------------------------------------------------------------------------

_GROUPED = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


def _text(row: dict, key: str, what: str) -> str:
    v = row.get(key)
    if v is None:
        raise Refused(f"no {what} field {key!r}")
    if isinstance(v, int | float) and not isinstance(v, bool):
        v = str(v)
    if not isinstance(v, str):
        raise Refused(f"field {key!r} is not a string")
    if not v.strip():
        raise Refused(f"field {key!r} is empty")
    return v


def _math_row(question: str, gold: str, **extra: Any) -> dict[str, Any]:
    gold = gold.strip()
    if not gold:
        raise Refused("empty final answer")
    if extract_gold(gold) != gold:  # the loader would read another answer back
        raise Refused("the final answer holds '####', 'The answer is:' or \\boxed{} itself")
    return {"question": question.strip(), "answer": gold, **{k: v for k, v in extra.items() if v is not None}}


def gsm8k_row(row: dict) -> dict[str, Any]:
    """One GSM8K row (``question``, ``answer`` ending ``#### N``) as the run's question/answer row."""
    question, reference = _text(row, "question", "question"), _text(row, "answer", "answer")
    gold = hash_answer(reference)
    if gold is None:
        raise Refused("no '#### N' final answer in the answer")
    if _GROUPED.fullmatch(gold):
        gold = gold.replace(",", "")
    return _math_row(question, gold, solution=reference)


def math_row(row: dict) -> dict[str, Any]:
    """One MATH row (``problem``, ``solution`` with ``\\boxed{}``, ``level``, ``type``; or a short ``answer``)."""
    question = _text(row, "problem", "problem")
    solution = row.get("solution") if isinstance(row.get("solution"), str) and row["solution"].strip() else None
    if isinstance(row.get("answer"), str | int | float) and str(row["answer"]).strip():
        gold = str(row["answer"])
    elif solution is None:
        raise Refused("no solution field 'solution' (nor a short 'answer')")
    else:
        gold = last_boxed(solution)
        if gold is None:
            raise Refused("no complete \\boxed{} answer in the solution")
    return _math_row(question, gold, solution=solution, level=row.get("level"), type=row.get("type"))


def polaris_row(row: dict) -> dict[str, Any]:
    """One Polaris-53K row (``problem``, short ``answer``, ``difficulty``)."""
    return _math_row(_text(row, "problem", "problem"), _text(row, "answer", "answer"),
                     difficulty=row.get("difficulty"))


# ---- code sets ---------------------------------------------------------------------------------------------

SOLVE = "solve"
STDIN_INSTRUCTION = ("\n\nWrite a Python function solve(input_text: str) -> str: it receives the whole standard input "
                     "as one string and returns the whole standard output as one string (it does not read input or "
                     "print).")
_SAME_OUTPUT = '''def _same_output(got, want):
    """LiveCodeBench's rule: stripped lines, equal as text or as numbers."""
    from decimal import Decimal, InvalidOperation

    a, b = [x.strip() for x in str(got).strip().split("\\n")], [y.strip() for y in want.strip().split("\\n")]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x != y:
            try:
                if [Decimal(t) for t in x.split()] != [Decimal(t) for t in y.split()]:
                    return False
            except InvalidOperation:
                return False
    return True

'''
_SAME_VALUE = '''def _plain(v):
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


def _same_value(got, want, wrapped):
    """The graders' rule: a tuple counts as a list; with wrapped, the single item of a list-wrapped answer too."""
    got = _plain(got)
    return got == want or (wrapped and isinstance(want, list) and len(want) == 1 and got == want[0])

'''


@dataclass
class _Test:
    kind: str  # "stdin" | "call"
    input: Any
    output: Any
    name: str | None = None


def _json(value: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise Refused(f"{what} is not valid JSON ({e.msg})") from None
    return value


def _tests_of(raw: Any, metadata: dict) -> tuple[str, list[_Test]]:
    """The layout name and the tests of one DeepCoder-style ``tests`` value."""
    tests = _json(raw, "tests")
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        ins, outs = tests["inputs"], tests["outputs"]
        if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs):
            raise Refused("taco tests: 'inputs' and 'outputs' are not lists of one length")
        name = tests.get("fn_name")
        return "taco", [_Test("call" if name else "stdin", i, o, name) for i, o in zip(ins, outs, strict=True)]
    if not isinstance(tests, list) or not all(isinstance(t, dict) for t in tests):
        raise Refused("unknown tests layout (expected a list of test objects or {'inputs', 'outputs'})")
    if tests and all("type" in t for t in tests):
        kinds = {"stdin_stdout": "stdin", "function_call": "call"}
        if any(t["type"] not in kinds for t in tests):
            raise Refused(f"unknown primeintellect test type {sorted({t['type'] for t in tests} - set(kinds))}")
        return "primeintellect", [_Test(kinds[t["type"]], t.get("input"), t.get("output"), t.get("fn_name"))
                                  for t in tests]
    if tests and all("testtype" in t for t in tests):
        kinds = {"stdin": "stdin", "stdin_stdout": "stdin", "functional": "call"}
        if any(t["testtype"] not in kinds for t in tests):
            raise Refused(f"unknown lcb test type {sorted({t['testtype'] for t in tests} - set(kinds))}")
        out = []
        for t in tests:
            if kinds[t["testtype"]] == "stdin":
                out.append(_Test("stdin", t.get("input"), t.get("output")))
                continue
            if not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
                raise Refused("lcb functional test: input and output must be JSON text")
            args = [_json(line, "lcb functional input") for line in t["input"].split("\n") if line.strip()]
            out.append(_Test("call", args, _json(t["output"], "lcb functional output"), metadata.get("func_name")))
        return "lcbv5", out
    return "stdin list", [_Test("stdin", t.get("input"), t.get("output")) for t in tests]


MAX_TEST_CHARS = 1_000_000  # a problem's tests source above this is refused (the sandbox ships it to every run)


def deepcoder_row(row: dict, index: int, *, stdin: str = "solve", max_tests: int = 15,
                  max_chars: int = MAX_TEST_CHARS) -> dict[str, Any]:
    """One DeepCoder-style row as a CodeTask row (see the module docstring)."""
    return _deepcoder(row, index, stdin=stdin, max_tests=max_tests, max_chars=max_chars)[0]


def _deepcoder(row: dict, index: int, *, stdin: str, max_tests: int, max_chars: int) -> tuple[dict[str, Any], str]:
    from scalerl_jax.data.code_tasks import parse_code_task

    problem = _text(row, "problem", "problem")
    metadata = _json(row.get("metadata") or {}, "metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    layout, tests = _tests_of(row.get("tests"), metadata)
    if not tests:
        raise Refused("no tests")
    kinds = {t.kind for t in tests}
    if len(kinds) > 1:
        raise Refused("mixed standard input and function-call tests")
    kept = sorted(sorted(range(len(tests)), key=lambda i: -len(repr(tests[i].input)))[:max_tests])
    tests = [tests[i] for i in kept]  # the longest inputs, in their order
    starter = row.get("starter_code") if isinstance(row.get("starter_code"), str) else ""
    prompt, prefix = problem.strip(), ""
    if starter.strip():
        prompt += f"\n\nStarter code:\n```python\n{starter.rstrip()}\n```"
    if kinds == {"stdin"}:
        if stdin == "refuse":
            raise Refused("standard input/output tests (--stdin refuse)")
        for t in tests:  # APPS/TACO's rule: a list of lines is the text of those lines
            t.input, t.output = (("\n".join(v) if isinstance(v, list) and all(isinstance(x, str) for x in v) else v)
                                 for v in (t.input, t.output))
        if any(not isinstance(t.input, str) or not isinstance(t.output, str) for t in tests):
            raise Refused("a standard input/output test whose input or output is not a string")
        prompt += STDIN_INSTRUCTION
        body = _SAME_OUTPUT + "".join(f"assert _same_output({SOLVE}({t.input!r}), {t.output!r})\n" for t in tests)
    else:
        names = {t.name for t in tests}
        name = names.pop() if len(names) == 1 else None
        if not name:
            raise Refused("function-call tests without one function name (fn_name / metadata.func_name)")
        if not name.isidentifier():
            raise Refused(f"function name {name!r} is not a Python identifier")
        if any(not isinstance(t.input, list) for t in tests):
            raise Refused("a function-call test whose input is not an argument list")
        if name not in prompt:
            prompt += f"\n\nThe solution defines the function {name}."
        # LeetCode's starter code annotates with typing names its graders import (List, Optional, ...)
        prefix = f"from typing import *  # noqa\n\n\ndef {name}(*args):\n    return Solution().{name}(*args)\n\n\n"
        wrapped = layout != "lcbv5"
        body = _SAME_VALUE + "".join(
            f"assert _same_value({name}({', '.join(repr(a) for a in t.input)}), {t.output!r}, {wrapped})\n"
            for t in tests)
    if len(body) > max_chars:
        raise Refused(f"tests over {max_chars} characters (--max-test-chars)")
    out = {"task_id": f"deepcoder/{index}", "prompt": prompt, "tests": body, "tag": "deepcoder"}
    if prefix:
        out["code_prefix"] = prefix
    try:
        parse_code_task(out, "deepcoder")
    except DataError as e:
        raise Refused(f"not a valid code task: {e}") from None
    return out, layout


# ---- the command ---------------------------------------------------------------------------------------------


@dataclass
class Report:
    """Rows read, kept and refused (reason -> count and the first rows) of one conversion."""

    read: int = 0
    kept: int = 0
    refused: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    layouts: Counter = field(default_factory=Counter)

    def refuse(self, where: str, reason: str) -> None:
        self.refused[reason] += 1
        self.examples.setdefault(reason, [])
        if len(self.examples[reason]) < 3:
            self.examples[reason].append(where)

    def lines(self) -> list[str]:
        out = [f"read {self.read} rows: kept {self.kept}, refused {sum(self.refused.values())}"]
        out += [f"  refused {n}: {reason} (e.g. {', '.join(self.examples[reason])})"
                for reason, n in self.refused.most_common()]
        if self.layouts:
            out.append("  kept by tests layout: " + ", ".join(f"{k} {n}" for k, n in self.layouts.most_common()))
        return out


def convert(kind: str, src: str | Path, *, split: str | None = None, limit: int | None = None,
            stdin: str = "solve", max_tests: int = 15, max_chars: int = MAX_TEST_CHARS
            ) -> tuple[list[dict[str, Any]], Report]:
    """The output rows of ``src`` read as ``kind``, and the report (nothing is written)."""
    if kind not in KINDS:
        raise PrepareError(f"unknown KIND {kind!r}; choose one of {', '.join(KINDS)}")
    report, rows, seen = Report(), [], {}
    for where, row in read_records(src, split):
        if limit is not None and report.read >= limit:
            break
        report.read += 1
        try:
            if isinstance(row, Refused):
                raise row
            if not isinstance(row, dict):
                raise Refused(f"a row is a JSON object, got {type(row).__name__}")
            if kind == "deepcoder":
                out, layout = _deepcoder(row, report.read - 1, stdin=stdin, max_tests=max_tests, max_chars=max_chars)
                key = out["prompt"]
            else:
                out = {"gsm8k": gsm8k_row, "math": math_row, "polaris": polaris_row}[kind](row)
                key = out["question"]
            if key in seen:
                raise Refused("duplicate problem")
        except Refused as e:
            report.refuse(where, str(e))
            continue
        seen[key] = where
        if kind == "deepcoder":
            report.layouts[layout] += 1
        rows.append(out)
        report.kept += 1
    return rows, report


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (0: rows written, 1: no row kept, 2: bad input)."""
    ap = argparse.ArgumentParser(prog="python -m scalerl_jax.data.prepare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=KINDS, metavar="KIND", help=f"published layout: {', '.join(KINDS)}")
    ap.add_argument("src", metavar="IN", help=".jsonl, .json, .parquet, a save_to_disk directory or a directory")
    ap.add_argument("out", metavar="OUT", help="the jsonl file to write")
    ap.add_argument("--split", help="the split of a DatasetDict saved with save_to_disk")
    ap.add_argument("--limit", type=int, help="read at most N input rows")
    ap.add_argument("--stdin", choices=("solve", "refuse"), default="solve",
                    help="deepcoder: pose standard input/output problems as solve(input_text) -> str, or refuse them")
    ap.add_argument("--max-tests", type=int, default=15, help="deepcoder: tests kept per problem (longest inputs)")
    ap.add_argument("--max-test-chars", type=int, default=MAX_TEST_CHARS,
                    help="deepcoder: refuse a problem whose tests source is longer")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    args = ap.parse_args(argv)
    prog = "[prepare]"
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        print(f"{prog} error: {out} exists; pass --overwrite to replace it", file=sys.stderr)
        return 2
    if args.max_tests < 1 or (args.limit is not None and args.limit < 1):
        print(f"{prog} error: --max-tests and --limit must be >= 1", file=sys.stderr)
        return 2
    try:
        rows, report = convert(args.kind, args.src, split=args.split, limit=args.limit, stdin=args.stdin,
                               max_tests=args.max_tests, max_chars=args.max_test_chars)
    except (PrepareError, OSError) as e:
        print(f"{prog} error: {e}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(f"{prog} {line}")
    if "test" in Path(args.src).name.lower():
        print(f"{prog} note: {args.src} looks like a test split: evaluation data, not training data")
    if not rows:
        print(f"{prog} error: no row kept; {out} not written", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    what = "CodeTask rows (data.code_path)" if args.kind == "deepcoder" else "question/answer rows (--data)"
    print(f"{prog} wrote {len(rows)} {what} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
