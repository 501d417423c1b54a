"""Rewards: exact match for the arithmetic task; math-verify on the real MATH-500 / GSM8K golds; timeouts."""

import os
import threading
import time

import numpy as np
import pytest

from scalerl_jax.data import CharTokenizer, Problem, arith_problem, load_jsonl
from scalerl_jax.rewards import MathVerifier, arith_reward, extract_arith_answer, score, score_arith
from tests.conftest import DATA


# -- arithmetic -------------------------------------------------------------------------------------------------
def test_arith_exact_match():
    assert arith_reward("12*3=36;7+36=43#43", "43") == 1.0
    assert arith_reward("12*3=36;7+36=43#43<eos><pad><pad>", "43") == 1.0
    assert arith_reward("#1#43", "43") == 1.0  # the last '#' counts
    assert arith_reward("12*3=36;7+36=43#430", "43") == -1.0
    assert arith_reward("12*3=36;7+36=43#4", "43") == -1.0
    assert arith_reward("12*3=36;7+36=43", "43") == -1.0  # no marker, no answer
    assert arith_reward("#43<eos>#44", "43") == 1.0  # text after eos is ignored
    assert extract_arith_answer("1+2") is None


def test_arith_from_token_ids_and_batch():
    tok = CharTokenizer()
    probs = [arith_problem(7, 12, 3), arith_problem(50, 20, 5), arith_problem(1, 2, 2)]
    good = tok.decode(tok.encode(probs[0].solution) + [tok.eos_id, tok.pad_id])
    completions = [good, "20*5=100;50+100=150#151", "2*2=4;1+4=5"]
    rewards, counts = score_arith(completions, probs)
    np.testing.assert_array_equal(rewards, np.array([1, -1, -1], np.float32))
    assert counts == {"no_answer": 1, "timeouts": 0}


# -- math-verify --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def verifier():
    # a real answer's check takes milliseconds: the limit is room for a loaded machine, so that a timeout here would
    # be the answer's, not the machine's (the timeout itself is tested with a tower no limit suffices for)
    with MathVerifier(timeout_s=30.0) as v:
        yield v


def _p(answer, pid=0):
    return Problem(prompt_id=pid, prompt="q", answer=answer, solution="", source="math")


def test_real_math500_golds(verifier):
    problems, _ = load_jsonl(os.path.join(DATA, "math500.jsonl"))
    problems = problems[:25]
    right = [f"Let me think. The final answer is $\\boxed{{{p.answer}}}$." for p in problems]
    rewards, counts = verifier.score(right, problems)
    assert rewards.tolist() == [1.0] * len(problems), [p.answer for p, r in zip(problems, rewards) if r < 0]
    assert counts == {"timeouts": 0, "no_answer": 0}
    # the dataset's own full solution text (boxed answer inside) also scores +1
    assert verifier.score([p.solution for p in problems[:10]], problems[:10])[0].tolist() == [1.0] * 10
    # the gold of another row with a visibly different integer value scores -1
    ints = [p for p in problems if p.answer.isdigit()]
    assert len(ints) >= 5
    wrong_pairs = [(a, b) for a, b in zip(ints, ints[1:] + ints[:1]) if int(a.answer) != int(b.answer)]
    wrong = [f"\\boxed{{{b.answer}}}" for a, b in wrong_pairs]
    assert verifier.score(wrong, [a for a, b in wrong_pairs])[0].tolist() == [-1.0] * len(wrong_pairs)


def test_real_gsm8k_golds(verifier):
    problems, _ = load_jsonl(os.path.join(DATA, "gsm8k_test.jsonl"))
    problems = problems[:25]
    # the reference solution ends in "#### <answer>": it must score +1 against its own row
    rewards, _ = verifier.score([p.solution for p in problems], problems)
    assert rewards.tolist() == [1.0] * 25
    shifted = problems[1:] + problems[:1]
    pairs = [
        (a, b)
        for a, b in zip(problems, shifted)
        if float(a.answer.replace(",", "")) != float(b.answer.replace(",", ""))
    ]
    assert len(pairs) >= 15
    rewards, _ = verifier.score([b.solution for a, b in pairs], [a for a, b in pairs])
    assert rewards.tolist() == [-1.0] * len(pairs)


def test_extraction_forms(verifier):
    cases = [
        ("so 3 + 4 = 7 and then \\boxed{42}", "42", "ok"),
        ("first \\boxed{41}, no wait, \\boxed{42}", "42", "ok"),
        ("so 3 + 4 = 7 and then \\boxed{41}", "42", "wrong"),
        ("She makes 9 * 2 = 18 dollars.\n#### 18", "18", "ok"),
        ("12 eggs... \n#### 17", "18", "wrong"),
        ("#### 1,000", "1000", "ok"),
        ("The answer is 0.5", "\\frac{1}{2}", "ok"),
        ("$\\boxed{\\dfrac{1}{2}}$", "0.5", "ok"),
        ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", "ok"),
        ("\\boxed{\\frac{1}{3}}", "\\frac{1}{2}", "wrong"),
        ("The result is 12.", "12", "ok"),
        ("I have no idea.", "12", "no_answer"),
        ("", "12", "no_answer"),
    ]
    for completion, gold, status in cases:
        assert verifier.judge(completion, gold) == status, (completion, gold)


def test_pathological_input_times_out():
    with MathVerifier(timeout_s=1.0) as verifier:
        _pathological_input_times_out(verifier)


def _pathological_input_times_out(verifier):
    before = verifier.counts["timeouts"]
    t0 = time.monotonic()
    status = verifier.judge("\\boxed{9^{9^{9^{8}}}}", "9^{9^{9^{9}}}")
    elapsed = time.monotonic() - t0
    assert status == "timeout"
    # bounded by the hard timeout (and, past it, a fresh worker's start-up: seconds, more on a loaded machine)
    assert elapsed < verifier.hard_timeout_s + 60.0
    assert verifier.counts["timeouts"] == before + 1
    rewards, counts = verifier.score(["\\boxed{9^{9^{9^{8}}}}", "\\boxed{2}"], [_p("9^{9^{9^{9}}}"), _p("2")])
    assert rewards.tolist() == [-1.0, 1.0] and counts["timeouts"] == 1


def test_hard_timeout_kills_and_restarts_worker():
    with MathVerifier(timeout_s=1.0, hard_timeout_s=0.3) as v:
        assert v.judge("\\boxed{3}", "3") == "ok"  # starts the worker outside the timed call
        t0 = time.monotonic()
        assert v.judge("\\boxed{9^{9^{9^{8}}}}", "9^{9^{9^{9}}}") == "timeout"
        # the tower would take forever: coming back at all shows the kill; the bound is a hang guard with room for a
        # loaded machine 4x slower (1.17 s measured with the 0.3 s hard timeout while a whole test suite and two runs
        # shared 2 cores)
        assert time.monotonic() - t0 < 60.0
        assert v.counts["restarts"] == 1
        assert v.judge("\\boxed{3}", "3") == "ok"  # a fresh worker


def test_works_from_a_thread(verifier):
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", verifier.reward("\\boxed{\\frac{1}{2}}", "0.5")))
    th.start()
    th.join(30)
    assert out["r"] == 1.0


def test_dispatching_score(verifier):
    probs = [arith_problem(7, 12, 3), _p("\\frac{1}{2}"), arith_problem(1, 2, 2), _p("5")]
    comps = ["12*3=36;7+36=43#43", "\\boxed{0.5}", "2*2=4;1+4=5#6", "nothing here"]
    rewards, counts = score(comps, probs, verifier)
    assert rewards.tolist() == [1.0, 1.0, -1.0, -1.0]
    assert counts == {"timeouts": 0, "no_answer": 1}


def test_integer_fast_path_agrees_with_math_verify():
    """Plain-integer answers are judged without the worker; the verdicts must be math-verify's own (the reference
    is the same verifier with the fast path off, so every pair goes through math-verify)."""
    problems, _ = load_jsonl(os.path.join(DATA, "gsm8k_test.jsonl"))
    golds = [p.answer for p in problems[:40]] + ["0", "-7", "1000", "0.5", "1,000"]
    completions = []
    for g in golds:
        completions += [f"so \\boxed{{{g}}}", f"so \\boxed{{{g}1}}", f"#### {g}", f"steps... \\boxed{{ 0{g} }}",
                        f"the answer is {g}"]
    pairs = [(c, g) for g in golds for c in completions[golds.index(g) * 5: golds.index(g) * 5 + 5]]
    with MathVerifier() as fast, MathVerifier() as slow:
        slow.fast_integers = False
        got = [fast.judge(c, g) for c, g in pairs]
        want = [slow.judge(c, g) for c, g in pairs]
    assert got == want
    assert got.count("ok") >= 40 and got.count("wrong") >= 40  # both verdicts were exercised
