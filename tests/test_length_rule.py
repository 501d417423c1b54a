"""The length-control rule (scalerl_jax/rollout/length_rule.py) and its two users: the engine's decode step
(decode.advance_rows, jitted, over slots filled by rows.fill_slot) and the client's interruption
(SGLangGenerator._client_interruption, over a fake server). Both are driven by the same scripted "model" (the next
token is a fixed function of the context) and the same budget draws, and must agree token for token."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.rollout.client import SGLangGenerator
from scalerl_jax.rollout.client.wire import Sample
from scalerl_jax.rollout.engine.decode import advance_rows
from scalerl_jax.rollout.engine.rows import Row, Submission, empty_slots, fill_slot
from scalerl_jax.rollout.length_rule import FINISH_NAMES, draw_budget, think_outcome
from scalerl_jax.rollout.protocol import GenerationRequest, LengthControl, SamplingParams

V, STOP, THINK_END, INTER = 12, 1, (5, 6), (9, 10)


def model(ctx: list[int]) -> int:
    """A deterministic next-token rule over the whole context (what a greedy model is to both paths)."""
    h = (sum((i + 1) * t for i, t in enumerate(ctx[-4:])) * 2654435761 + len(ctx) * 97 + ctx[0] * 31) % 2**32
    if ctx[-1] == THINK_END[0] and h % 3:  # the think end completes often enough to occur in the cases
        return THINK_END[1]
    return (h >> 7) % V


def engine_path(prompt, sp: SamplingParams, lc: LengthControl, budgets: list[int]) -> list[dict]:
    """Each sample through the engine's state machine (one slot per sample), the jitted advance_rows per step."""
    sub = Submission([GenerationRequest(prompt_ids=prompt, params=sp, length=lc)], None, 1)
    B = len(budgets)
    consts, st = empty_slots(B, 4, len(lc.think_end_ids), len(lc.interruption_ids))
    for b, budget in enumerate(budgets):
        fill_slot(consts, st, b, Row(sub, 0, b, list(prompt), 0.0, 1.0, sp.max_new_tokens, sp.stop_token_ids, lc,
                                     budget, np.zeros(2, np.uint32), b))
    step = jax.jit(advance_rows)
    st, rows = {k: jnp.asarray(v) for k, v in st.items()}, {k: jnp.asarray(v) for k, v in consts.items()}
    out = [{"tokens": [], "injected": []} for _ in range(B)]
    for _ in range(sp.max_new_tokens + 1):
        if bool(np.all(np.asarray(st["done"]))):
            break
        samp = jnp.asarray([model(list(prompt) + o["tokens"]) for o in out], jnp.int32)
        st, (tok, _lp, emitted, injected) = step(st, rows, samp, jnp.zeros(B, jnp.float32))
        for b in np.flatnonzero(np.asarray(emitted)):
            out[b]["tokens"].append(int(tok[b]))
            out[b]["injected"].append(bool(injected[b]))
    for b, o in enumerate(out):
        o["finish"] = FINISH_NAMES[int(st["finish"][b])]
    return out


def fake_call(body, url=None):
    """A server with the scripted model: greedy continuation of input_ids up to a stop id or max_new_tokens."""
    sp = body["sampling_params"]
    stops = set(sp.get("stop_token_ids", []))
    samples = []
    for _ in range(sp["n"]):
        ctx, toks = list(body["input_ids"]), []
        while len(toks) < sp["max_new_tokens"] and not (toks and toks[-1] in stops):
            toks.append(model(ctx + toks))
        fin = "stop" if toks and toks[-1] in stops else "length"
        samples.append(Sample(toks, [0.0] * len(toks), [0] * len(toks), [False] * len(toks), fin, fin == "length",
                              None, False))
    return "http://fake", samples


CASES = list(itertools.product([[3], [4, 7], [2, 8, 11], [11, 3, 2, 6]], [(1, 3), (2, 9), (6, 14)], [0, 2, 5], [0, 6],
                               [(STOP,), ()]))


def test_engine_and_client_interruption_agree_token_for_token():
    gen = SGLangGenerator(["http://fake"], server_length_control=False)
    gen._call = fake_call
    kinds = set()
    try:
        for seed, (prompt, (lo, hi), ans, slack, stops) in enumerate(CASES):
            lc = LengthControl(think_end_ids=THINK_END, interruption_ids=INTER, budget_lo=lo, budget_hi=hi,
                               answer_budget=ans)
            sp = SamplingParams(max_new_tokens=hi + len(INTER) + ans + slack, n=3, stop_token_ids=stops)
            budgets = [draw_budget(r, lc) for r in [np.random.default_rng(seed)] for _ in range(sp.n)]
            eng = engine_path(prompt, sp, lc, budgets)
            gen.reseed(seed)  # the client draws the same budgets from the same seed
            comps = gen._client_interruption("r", GenerationRequest(prompt_ids=prompt, params=sp, length=lc), lc)
            for e, c, budget in zip(eng, comps, budgets):
                where = f"case {seed} {CASES[seed]}, budget {budget}"
                assert c.think_budget == budget, where
                assert c.token_ids == e["tokens"], where
                assert c.injected == e["injected"], where
                assert c.finish_reason == e["finish"], where
                assert c.truncated == (e["finish"] == "length"), where
                kinds.add((e["finish"], any(e["injected"])))
    finally:
        gen.close()
    # every outcome of the rule occurred: interrupted then stopped / ran out of answer budget, stopped while
    # thinking or after thinking ended, length after thinking ended
    assert kinds >= {("interrupted", True), ("length", True), ("stop", False), ("length", False)}, kinds


def test_think_outcome_hand_worked():
    te = (5, 6)
    # thinking ends at token 3 (5, 6 completed), budget 4: plain generation from there
    assert think_outcome([1, 5, 6, 2, 2], False, te, 4, 20) == ("think_end", 3)
    # budget 2 comes first: cut after 2 tokens, then the interruption
    assert think_outcome([1, 5, 6, 2, 2], False, te, 2, 20) == ("interrupt", 2)
    # a think end completed at the budget's last token ends thinking (no interruption)
    assert think_outcome([1, 5, 6, 2, 2], False, te, 3, 20) == ("think_end", 3)
    # a stop within the budget wins; at the budget's token too
    assert think_outcome([1, 4, 8], True, te, 5, 20) == ("stop", 3)
    assert think_outcome([1, 4, 8], True, te, 3, 20) == ("stop", 3)
    # max_new_tokens reached with the budget: length, not an interruption
    assert think_outcome([1, 4, 8, 8], False, te, 4, 4) == ("length", 4)
    # nothing happened within the tokens
    assert think_outcome([1, 4], False, te, 9, 20) == ("open", 2)
    assert think_outcome([], False, te, 9, 20) == ("open", 0)
    # the think end must be in the output: a 6 alone at the start does not match (5, 6)
    assert think_outcome([6, 1], False, te, 9, 20) == ("open", 2)


@pytest.mark.parametrize("lo,hi", [(1, 1), (3, 7), (10, 12)])
def test_draw_budget_is_uniform_over_lo_hi(lo, hi):
    lc = LengthControl(think_end_ids=(1,), interruption_ids=(2,), budget_lo=lo, budget_hi=hi, answer_budget=0)
    rng = np.random.default_rng(0)
    draws = np.array([draw_budget(rng, lc) for _ in range(3000)])
    assert draws.min() == lo and draws.max() == hi
    counts = np.bincount(draws - lo, minlength=hi - lo + 1)
    expected = len(draws) / (hi - lo + 1)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))  # 5 sigma of a binomial count
