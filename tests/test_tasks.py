"""The synthetic arithmetic task: answers checked by independent arithmetic, deterministic disjoint splits."""

import re

import pytest

from scalerl_jax.data import (
    ARITH_SPACE,
    CharTokenizer,
    arith_id,
    arith_problem,
    arith_problems,
    arith_split,
    arith_triple,
    split_thinking,
)

PROMPT_RE = re.compile(r"^(\d+)\+(\d+)\*(\d+)=$")


def _check(p):
    a, b, c = (int(x) for x in PROMPT_RE.match(p.prompt).groups())
    assert 0 <= a <= 99 and 2 <= b <= 99 and 2 <= c <= 9
    y = a + b * c
    assert p.answer == str(y)
    assert p.solution == f"{b}*{c}={b * c};{a}+{b * c}={y}#{y}"
    thinking, answer = split_thinking(p.solution)
    assert answer == str(y)
    # every "u op v=w" equation in the scratchpad is true
    for u, op, v, w in re.findall(r"(\d+)([+*])(\d+)=(\d+)", thinking):
        assert (int(u) + int(v) if op == "+" else int(u) * int(v)) == int(w)
    assert p.source == "arith"
    return a, b, c


def test_problem_answers_independent():
    p = arith_problem(7, 12, 3)
    assert (p.prompt, p.answer, p.solution) == ("7+12*3=", "43", "12*3=36;7+36=43#43")
    assert arith_problem(0, 2, 2).solution == "2*2=4;0+4=4#4"
    assert arith_problem(99, 99, 9).answer == "990"
    for p in arith_problems(500, seed=3):
        _check(p)


def test_space_and_ids():
    assert ARITH_SPACE == 100 * 98 * 8
    seen = set()
    for pid in range(ARITH_SPACE):
        t = arith_triple(pid)
        assert arith_id(*t) == pid
        seen.add(t)
    assert len(seen) == ARITH_SPACE
    with pytest.raises(ValueError):
        arith_id(0, 1, 2)
    with pytest.raises(ValueError):
        arith_triple(ARITH_SPACE)


def test_completion_fits_tokenizer_and_length():
    tok = CharTokenizer()
    longest = max(len(tok.encode(arith_problem(a, 99, 9).solution)) + 1 for a in (0, 9, 10, 99))
    assert longest <= 24  # "99*9=891;99+891=990#990" + eos


def test_generation_deterministic_and_distinct():
    a = arith_problems(300, seed=5)
    assert a == arith_problems(300, seed=5)
    assert a != arith_problems(300, seed=6)
    assert len({p.prompt_id for p in a}) == 300
    assert len({p.prompt for p in a}) == 300


def test_split_disjoint():
    train, val = arith_split(5000, 1000, seed=0)
    assert len(train) == 5000 and len(val) == 1000
    train_triples = {_check(p) for p in train}
    val_triples = {_check(p) for p in val}
    assert len(train_triples) == 5000 and len(val_triples) == 1000
    assert not train_triples & val_triples
    assert [p.prompt_id for p in val] == sorted(p.prompt_id for p in val)
    # validation is independent of n_train: growing the training set never moves a validation prompt
    train2, val2 = arith_split(None, 1000, seed=0)
    assert val2 == val
    assert len(train2) == ARITH_SPACE - 1000
    assert not {p.prompt_id for p in train2} & {p.prompt_id for p in val}
    assert arith_split(100, 50, seed=1) != arith_split(100, 50, seed=2)
    with pytest.raises(ValueError):
        arith_split(ARITH_SPACE, 1, seed=0)


def test_split_with_b_max_keeps_only_small_multipliers():
    # the space with b <= 19: a in 0..99 (100) x b in 2..19 (18) x c in 2..9 (8) = 14,400 triples
    train, val = arith_split(None, 200, seed=3, b_max=19)
    assert len(train) + len(val) == 100 * 18 * 8
    triples = [_check(p) for p in train + val]
    assert all(b <= 19 for _, b, _ in triples)
    assert len(set(triples)) == 14_400  # every such triple once, train and validation disjoint
    assert {b for _, b, _ in triples} == set(range(2, 20))
    assert set(arith_split(300, 50, seed=3, b_max=19)[1]) <= set(val)  # a smaller held-out set is a subset
    # the default (b_max 99) is the whole space, as before the argument existed
    assert arith_split(100, 50, seed=1, b_max=99) == arith_split(100, 50, seed=1)
    with pytest.raises(ValueError, match="b_max"):
        arith_split(100, 50, seed=1, b_max=1)
    with pytest.raises(ValueError, match="must be <= 14400"):
        arith_split(14_400, 1, seed=0, b_max=19)


def test_split_thinking():
    assert split_thinking("abc#d#12") == ("abc#d", "12")
    assert split_thinking("no marker") == ("no marker", None)
    assert split_thinking("#") == ("", "")
