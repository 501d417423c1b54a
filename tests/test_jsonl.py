"""jsonl math sets: the real MATH-500 and GSM8K files, field detection, malformed rows, prompt templates."""

import json
import os

import pytest

from scalerl_jax.data import DEFAULT_TEMPLATE, DataError, extract_gold, hash_answer, last_boxed, load_jsonl, make_prompt
from tests.conftest import DATA

MATH500 = os.path.join(DATA, "math500.jsonl")
GSM8K = os.path.join(DATA, "gsm8k_test.jsonl")


def _count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def test_math500_loads():
    problems, skipped = load_jsonl(MATH500)
    assert skipped == 0
    assert len(problems) == _count_lines(MATH500) == 500
    assert [p.prompt_id for p in problems] == list(range(500))
    assert {p.source for p in problems} == {"math500"}
    # gold answers read off by hand from the file
    assert problems[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert problems[2].answer == "\\frac{14}{3}"
    assert problems[3].answer == "9"
    assert problems[4].answer == "\\text{Evelyn}"
    with open(MATH500) as f:
        row0 = json.loads(f.readline())
    assert problems[0].prompt.startswith(row0["question"])
    assert problems[0].solution == row0["answer"]
    assert all(p.answer for p in problems)


def test_gsm8k_loads():
    problems, skipped = load_jsonl(GSM8K, id_offset=1000)
    assert skipped == 0
    assert len(problems) == _count_lines(GSM8K) == 1319
    assert problems[0].prompt_id == 1000 and problems[-1].prompt_id == 1000 + 1318
    assert problems[0].answer == "18" and problems[1].answer == "3"
    # every GSM8K gold is a number (commas allowed)
    assert all(p.answer.replace(",", "").lstrip("-").replace(".", "", 1).isdigit() for p in problems)


def test_field_detection_and_templates(tmp_path):
    path = tmp_path / "hf_math.jsonl"
    rows = [
        {"problem": "What is 1+1?", "solution": "It is $\\boxed{2}$.", "answer": "2"},
        {"problem": "Half of one?", "solution": "$\\boxed{\\frac{1}{2}}$"},
        {"query": "Q3", "final_answer": 7},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    problems, skipped = load_jsonl(str(path), template="Q: {question} A:")
    assert skipped == 0
    assert [p.answer for p in problems] == ["2", "\\frac{1}{2}", "7"]
    assert problems[0].solution == "It is $\\boxed{2}$."
    assert problems[0].prompt == "Q: What is 1+1? A:"
    problems, _ = load_jsonl(str(path), template=lambda q: q.upper())
    assert problems[0].prompt == "WHAT IS 1+1?"
    assert (
        make_prompt("Solve x.") == "Solve x.\n\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    assert "{question}" in DEFAULT_TEMPLATE
    with pytest.raises(ValueError):
        make_prompt("q", "no placeholder")


def test_malformed_rows_error_or_skip(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [
        json.dumps({"question": "ok 1", "answer": "#### 5"}),
        '{"question": "broken", ',
        json.dumps({"question": "no answer here"}),
        json.dumps({"question": "   ", "answer": "1"}),
        "",
        json.dumps([1, 2]),
        json.dumps({"question": "ok 2", "answer": "#### 6"}),
    ]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: invalid JSON"):
        load_jsonl(str(path))
    problems, skipped = load_jsonl(str(path), skip_malformed=True)
    assert skipped == 4
    assert [(p.prompt_id, p.answer) for p in problems] == [(0, "5"), (6, "6")]
    for bad_line, msg in ((3, "no answer field"), (4, "empty"), (6, "JSON object")):
        one = tmp_path / f"one{bad_line}.jsonl"
        one.write_text("\n".join(lines[:1] + [lines[bad_line - 1]]) + "\n")
        with pytest.raises(DataError, match=rf"{one}:2: .*{msg}"):
            load_jsonl(str(one))


def test_answer_extraction_helpers():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.") == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("\\boxed{unbalanced") is None
    assert last_boxed("nothing") is None
    assert hash_answer("work\n#### 1,000\n") == "1,000"
    assert hash_answer("no marker") is None
    assert extract_gold("so $\\boxed{9}$.The answer is: 9") == "9"
    assert extract_gold("only \\boxed{x+1} here") == "x+1"
    assert extract_gold(" 12 ") == "12"
