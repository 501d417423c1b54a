"""scalerl_jax.data.prepare on hand-written rows in the published layouts (tests/fixtures/prepare/README.md): the
exact rows written, every refusal counted under its reason, the written files read back by the run's own loaders, and
the code tasks graded in the sandbox (a right program passes, a wrong one fails)."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from scalerl_jax.data import prepare
from scalerl_jax.data.code_tasks import extract_program, load_code_tasks
from scalerl_jax.data.jsonl import load_jsonl

FIX = Path(__file__).parent / "fixtures" / "prepare"


def test_gsm8k_rows_and_refusals(tmp_path, capsys):
    out = tmp_path / "gsm8k.jsonl"
    assert prepare.main(["gsm8k", str(FIX / "gsm8k_train.jsonl"), str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [
        {"question": "Tom has 3 boxes with 4 pens in each box. He gives away 5 pens. How many pens does he have left?",
         "answer": "7", "solution": "Tom has 3*4=<<3*4=12>>12 pens.\nAfter giving 5 away he has 12-5=<<12-5=7>>7 "
                                    "pens.\n#### 7"},
        {"question": "A farm sells 40 crates of 30 eggs each day. How many eggs does it sell in a day?",
         "answer": "1200", "solution": "It sells 40*30=<<40*30=1200>>1200 eggs.\n#### 1,200"}]
    printed = capsys.readouterr().out
    assert "read 6 rows: kept 2, refused 4" in printed
    for reason, where in (("no '#### N' final answer in the answer", ":3"), ("duplicate problem", ":4"),
                          ("field 'question' is empty", ":5"), ("invalid JSON", ":6")):
        assert f"refused 1: {reason}" in printed and f"gsm8k_train.jsonl{where})" in printed
    problems, skipped = load_jsonl(str(out), template="{question}")  # the run's loader reads the same gold answers
    assert [p.answer for p in problems] == ["7", "1200"] and skipped == 0
    assert problems[1].prompt == rows[1]["question"] and problems[1].solution == rows[1]["solution"]


def test_math_release_directory_and_the_math500_layout(tmp_path):
    rows, report = prepare.convert("math", FIX / "math")  # one .json per problem, read in name order
    assert rows == [
        {"question": "If $2x + 3 = 11$, what is $x$?", "answer": "4",
         "solution": "Subtracting 3 gives $2x = 8$, so $x = \\boxed{4}$.", "level": "Level 1", "type": "Algebra"},
        {"question": "A circle has radius $\\frac{1}{2}$. What is its area?", "answer": "\\frac{\\pi}{4}",
         "solution": "The area is $\\pi r^2 = \\pi \\cdot \\frac14 = \\boxed{\\frac{\\pi}{4}}$.", "level": "Level 2",
         "type": "Geometry"}]
    assert (report.read, report.kept) == (3, 2)
    assert report.refused == Counter({"no complete \\boxed{} answer in the solution": 1})
    assert report.examples["no complete \\boxed{} answer in the solution"] == ["train/number_theory/3.json"]
    rows, report = prepare.convert("math", FIX / "math500_hf.jsonl")  # a short 'answer' beside the solution wins
    assert [(r["answer"], r["level"]) for r in rows] == [("10", 1), ("5\\sqrt{2}", 2)] and not report.refused


def test_polaris_rows_and_refusals(tmp_path):
    out = tmp_path / "polaris53k.jsonl"
    assert prepare.main(["polaris", str(FIX / "polaris.jsonl"), str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [
        {"question": "Find the sum of all positive divisors of 12.", "answer": "28", "difficulty": "3/8"},
        {"question": "What is $\\frac{3}{4} + \\frac{1}{8}$?", "answer": "\\frac{7}{8}", "difficulty": "7/8"},
        {"question": "How many primes are less than 20?", "answer": "8", "difficulty": "5/8"}]
    _, report = prepare.convert("polaris", FIX / "polaris.jsonl")
    assert report.refused == Counter({"field 'answer' is empty": 1, "the final answer holds '####', 'The answer is:' "
                                      "or \\boxed{} itself": 1})
    assert [p.answer for p in load_jsonl(str(out))[0]] == ["28", "\\frac{7}{8}", "8"]


def test_deepcoder_rows_and_refusals():
    rows, report = prepare.convert("deepcoder", FIX / "deepcoder.jsonl")
    assert (report.read, report.kept) == (10, 7)
    assert report.refused == Counter({"tests is not valid JSON (Expecting value)": 1, "no tests": 1,
                                      "function-call tests without one function name (fn_name / "
                                      "metadata.func_name)": 1})
    assert report.layouts == Counter({"primeintellect": 2, "taco": 2, "lcbv5": 2, "stdin list": 1})
    assert [r["task_id"] for r in rows] == [f"deepcoder/{i}" for i in range(7)]
    stdin = rows[0]
    assert stdin["prompt"] == "Read n and then n integers. Print their sum." + prepare.STDIN_INSTRUCTION
    assert "code_prefix" not in stdin and stdin["tag"] == "deepcoder"
    assert stdin["tests"].endswith("assert _same_output(solve('3\\n1 2 3\\n'), '6\\n')\n"
                                   "assert _same_output(solve('1\\n5\\n'), '5\\n')\n")
    taco_call = rows[3]
    assert taco_call["prompt"] == ("Complete the function so that it returns the product of a and b.\n\nStarter code:\n"
                                   "```python\ndef multiply(a, b):\n```")
    assert taco_call["code_prefix"].endswith("def multiply(*args):\n    return Solution().multiply(*args)\n\n\n")
    assert taco_call["tests"].endswith("assert _same_value(multiply(2, 3), [6], True)\n"
                                       "assert _same_value(multiply(10, -4), [-40], True)\n")
    lcb = rows[4]  # one JSON value per input line; the output one JSON value, compared unwrapped
    assert lcb["tests"].endswith("assert _same_value(twoSum([2, 7, 11, 15], 9), [0, 1], False)\n"
                                 "assert _same_value(twoSum([3, 2, 4], 6), [1, 2], False)\n")
    assert rows[1]["prompt"] == "Write a function add_up(xs) that returns the sum of the list xs."  # names it already
    assert rows[2]["tests"].endswith("assert _same_output(solve('10 -4\\n'), '6\\n')\n")
    refused, report = prepare.convert("deepcoder", FIX / "deepcoder.jsonl", stdin="refuse")
    assert [r["task_id"] for r in refused] == ["deepcoder/1", "deepcoder/3", "deepcoder/4"]
    assert report.refused["standard input/output tests (--stdin refuse)"] == 4
    one, _ = prepare.convert("deepcoder", FIX / "deepcoder.jsonl", max_tests=1)
    assert one[2]["tests"].count("assert _same_output") == 1 and "solve('10 -4\\n')" in one[2]["tests"]  # longest
    short, report = prepare.convert("deepcoder", FIX / "deepcoder.jsonl", max_chars=100)
    assert short == [] and report.refused["tests over 100 characters (--max-test-chars)"] == 7


RIGHT = {0: "def solve(t):\n    n, *xs = t.split()\n    return str(sum(map(int, xs)))\n",
         1: "def add_up(xs):\n    return sum(xs)\n",
         2: "def solve(t):\n    a, b = map(int, t.split())\n    return f'{a + b}\\n'\n",
         3: "class Solution:\n    def multiply(self, a, b):\n        return a * b\n",
         4: "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        seen = {}\n"
            "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
            "                return (seen[target - x], i)\n            seen[x] = i\n",
         5: "def solve(t):\n    return t.strip()[::-1]\n",
         6: "def solve(t):\n    return 'YES' if int(t) % 2 == 0 and int(t) > 2 else 'NO'\n"}
WRONG = {0: "def solve(t):\n    return '7'\n", 1: "def add_up(xs):\n    return sum(xs) + 1\n",
         2: "def solve(t):\n    return '5'\n", 3: "def multiply(a, b):\n    return a + b\n",
         4: "class Solution:\n    def twoSum(self, nums, target):\n        return [0]\n",
         5: "def solve(t):\n    return t\n", 6: "def solve(t):\n    return 'YES'\n"}


def test_deepcoder_tasks_grade_programs_in_the_sandbox(tmp_path):
    """The written file loads as CodeTasks; each right program (a module function, LeetCode's class Solution with
    typing annotations and a tuple answer, a solve() with a missing trailing newline) passes, each wrong one fails."""
    from scalerl_jax.rewards.code_pool import CodeJob, CodePool
    from scalerl_jax.rewards.code_types import SandboxConfig

    out = tmp_path / "deepcoder.jsonl"
    assert prepare.main(["deepcoder", str(FIX / "deepcoder.jsonl"), str(out)]) == 0
    tasks, skipped = load_code_tasks(str(out))
    assert len(tasks) == 7 and skipped == 0
    jobs = [CodeJob(extract_program(f"```python\n{src[i]}```", t.code_prefix, t.entry_point), t.tests, t.entry_point)
            for src in (RIGHT, WRONG) for i, t in enumerate(tasks)]
    pool = CodePool(SandboxConfig(workers=4))
    try:
        results = pool.map(jobs)
    finally:
        pool.close()
    assert [r.passed for r in results] == [True] * 7 + [False] * 7, [r.detail for r in results]


def test_inputs_that_cannot_be_read_lose_nothing(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_text("keep me\n")
    assert prepare.main(["polaris", str(FIX / "polaris.jsonl"), str(out)]) == 2  # an existing OUT is kept
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.read_text() == "keep me\n"
    new = tmp_path / "new.jsonl"
    assert prepare.main(["polaris", str(FIX / "gsm8k_train.jsonl"), str(new)]) == 1  # no row has 'problem'
    assert "no row kept" in capsys.readouterr().err and not new.exists()
    (tmp_path / "rows.csv").write_text("a,b\n")
    assert prepare.main(["gsm8k", str(tmp_path / "rows.csv"), str(new)]) == 2
    assert "unknown file type '.csv'" in capsys.readouterr().err
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert prepare.main(["gsm8k", str(saved), str(new)]) == 2
    assert "splits ['train', 'test']; choose one with --split" in capsys.readouterr().err


def test_parquet_and_saved_datasets_read_the_same_rows_or_name_the_missing_library(tmp_path, capsys):
    rows = [json.loads(line) for line in (FIX / "polaris.jsonl").read_text().splitlines()][:3]
    expected, _ = prepare.convert("polaris", FIX / "polaris.jsonl", limit=3)
    if importlib.util.find_spec("pyarrow") is None:
        (tmp_path / "train.parquet").write_bytes(b"PAR1")
        assert prepare.main(["polaris", str(tmp_path / "train.parquet"), str(tmp_path / "o.jsonl")]) == 2
        assert "reading parquet needs pyarrow, which is not installed" in capsys.readouterr().err
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([{**r, "answer": str(r["answer"])} for r in rows]), tmp_path / "t.parquet")
        assert prepare.convert("polaris", tmp_path / "t.parquet")[0] == expected
    saved = tmp_path / "saved"
    if importlib.util.find_spec("datasets") is None:
        saved.mkdir()
        (saved / "state.json").write_text("{}")
        assert prepare.main(["polaris", str(saved), str(tmp_path / "o.jsonl")]) == 2
        assert "reading it needs the datasets library, which is not installed" in capsys.readouterr().err
    else:
        import datasets

        datasets.Dataset.from_list([{**r, "answer": str(r["answer"])} for r in rows]).save_to_disk(str(saved))
        assert prepare.convert("polaris", saved)[0] == expected


def test_a_test_split_is_named_as_evaluation_data(tmp_path, capsys):
    src = tmp_path / "gsm8k_test.jsonl"
    src.write_text((FIX / "gsm8k_train.jsonl").read_text().splitlines()[0] + "\n")
    assert prepare.main(["gsm8k", str(src), str(tmp_path / "o.jsonl")]) == 0
    assert "looks like a test split: evaluation data, not training data" in capsys.readouterr().out


@pytest.mark.parametrize("kind", prepare.KINDS)
def test_every_kind_refuses_rows_that_are_not_objects(kind, tmp_path):
    src = tmp_path / "rows.json"
    src.write_text(json.dumps([["a list"], "a string"]))
    rows, report = prepare.convert(kind, src)
    assert rows == [] and report.refused == Counter({"a row is a JSON object, got list": 1,
                                                     "a row is a JSON object, got str": 1})
