"""Interruption length control of the JaxEngine, checked against hand-derived token sequences.

The model is a hand-built deterministic bigram automaton over the CharTokenizer vocabulary: every layer weight
is zero (attention and MLP add nothing to the residual stream), the embedding is one-hot and the LM head maps
token i to a large logit on succ(i). Whatever the engine does, the next token is succ(last token), so the
expected completions (thinking, injected interruption, answer) can be written down by hand.
"""

import numpy as np
import pytest

from scalerl_jax.models import param_shapes, presets
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.protocol import INJECTED_VERSION, GenerationRequest, LengthControl, SamplingParams

EOS, PLUS, TIMES, EQ, SEMI, HASH = 1, 12, 13, 14, 15, 16  # CharTokenizer ids; '#' ends thinking
DIGITS = list(range(2, 12))


def _succ(i: int) -> int:
    if i in DIGITS:
        return 2 if i == 11 else i + 1  # digits cycle forever: thinking never ends on its own
    return {PLUS: TIMES, TIMES: HASH, HASH: EQ, EQ: SEMI, SEMI: EOS}.get(i, EOS)


def _bigram_params(cfg):
    params = {k: ({kk: np.zeros(vv, np.float32) for kk, vv in v.items()} if isinstance(v, dict) else
                  np.zeros(v, np.float32)) for k, v in param_shapes(cfg).items()}
    params["layers"]["attn_norm"][:] = 1.0
    params["layers"]["mlp_norm"][:] = 1.0
    params["final_norm"][:] = 1.0
    for i in range(cfg.vocab_size):
        params["embed"][i, i] = 1.0
        params["lm_head"][i, _succ(i)] = 10.0
    return params


def _chain(last: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        last = _succ(last)
        out.append(last)
    return out


@pytest.fixture(scope="module")
def engine():
    cfg = presets.tiny()
    return JaxEngine(cfg, _bigram_params(cfg), max_batch=16, max_len=24, decode_chunk=3, seed=1, version=4)


INTER = (SEMI, HASH)  # the interruption "phrase"; it ends with the think-end marker


def _req(prompt, lo, hi, answer_budget, *, n=1, temperature=0.0, think_end=(HASH,)):
    lc = LengthControl(think_end_ids=think_end, interruption_ids=INTER, budget_lo=lo, budget_hi=hi,
                       answer_budget=answer_budget)
    sp = SamplingParams(temperature=temperature, max_new_tokens=20,
                        stop_token_ids=(EOS,), n=n)
    return GenerationRequest(prompt_ids=list(prompt), params=sp, length=lc)


def test_interrupted_exactly_at_budget_then_answers(engine):
    (c,), = engine.generate([_req([2, 3], 5, 5, answer_budget=4, temperature=1.0)])
    think = _chain(3, 5)  # 4 5 6 7 8: five digits, no '#'
    answer = _chain(HASH, 3)  # '=' ';' eos
    assert c.token_ids == think + list(INTER) + answer
    assert c.injected == [False] * 5 + [True, True] + [False] * 3
    assert c.versions == [4] * 5 + [INJECTED_VERSION] * 2 + [4] * 3
    assert c.logprobs[5:7] == [0.0, 0.0]
    assert c.finish_reason == "interrupted" and not c.truncated and c.interrupted
    assert c.think_budget == 5


def test_answer_budget_truncates(engine):
    (c,), = engine.generate([_req([9], 4, 4, answer_budget=2)])
    assert c.token_ids == _chain(9, 4) + list(INTER) + _chain(HASH, 2)
    assert c.finish_reason == "length" and c.truncated
    assert sum(not f for f in c.injected[6:]) == 2


def test_think_end_before_budget_is_not_interrupted(engine):
    reqs = [_req([PLUS], 5, 5, answer_budget=4), _req([PLUS], 2, 2, answer_budget=4),
            _req([PLUS], 5, 5, answer_budget=1, think_end=(TIMES, HASH))]
    outs = engine.generate(reqs)
    for (c,) in outs:
        # '+' -> '*' '#' closes thinking at token 2 (exactly at the budget in the 2nd request), then '=' ';' eos
        assert c.token_ids == [TIMES, HASH, EQ, SEMI, EOS]
        assert not any(c.injected) and c.finish_reason == "stop" and not c.truncated
        assert INJECTED_VERSION not in c.versions


def test_drawn_budgets_any_chunk_alignment(engine):
    lo, hi = 3, 9
    (comps,) = engine.generate([_req([7], lo, hi, answer_budget=3, n=8)])
    budgets = [c.think_budget for c in comps]
    assert all(lo <= b <= hi for b in budgets) and len(set(budgets)) > 1
    for c in comps:
        b = c.think_budget
        assert c.token_ids == _chain(7, b) + list(INTER) + _chain(HASH, 3)
        assert c.injected.index(True) == b  # injected right after exactly `b` generated tokens
        assert c.finish_reason == "interrupted"


def test_max_new_tokens_must_cover_the_interruption(engine):
    lc = LengthControl(think_end_ids=(HASH,), interruption_ids=INTER, budget_lo=4, budget_hi=8, answer_budget=4)
    bad = GenerationRequest(prompt_ids=[2], params=SamplingParams(max_new_tokens=10), length=lc)
    with pytest.raises(ValueError, match="budget_hi"):
        engine.generate([bad])
