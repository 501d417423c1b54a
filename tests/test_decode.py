"""scalerl_jax/rollout/engine/decode.py: the per-row state machine (advance_rows) on hand-worked token streams, and the
slot-cache scatter (padding slots dropped). The model-driven decode is covered by test_engine.py and
test_interruption.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from scalerl_jax.rollout.engine.decode import FINISH_NAMES, _scatter_rows, advance_rows
from scalerl_jax.rollout.engine.rows import Row, Submission, empty_slots, fill_slot
from scalerl_jax.rollout.length_rule import PH_ANSWER, PH_FREE, PH_INJECT, PH_THINK
from scalerl_jax.rollout.protocol import GenerationRequest, LengthControl, SamplingParams

LC = LengthControl(think_end_ids=(5, 6), interruption_ids=(9, 10), budget_lo=2, budget_hi=2, answer_budget=2)


def _run(samples: list[int], budget: int | None, lc: LengthControl | None = LC, max_new: int = 12):
    """One row fed ``samples`` (one per step); returns (emitted tokens, injected flags, phases, finish)."""
    sp = SamplingParams(max_new_tokens=max_new, stop_token_ids=(1,))
    sub = Submission([GenerationRequest(prompt_ids=[3], params=sp, length=lc)], None, 1)
    consts, st = empty_slots(1, 2, 2, 2)
    fill_slot(consts, st, 0, Row(sub, 0, 0, [3], 1.0, 1.0, max_new, (1,), lc, budget, np.zeros(2, np.uint32), 0))
    rows, st = {k: jnp.asarray(v) for k, v in consts.items()}, {k: jnp.asarray(v) for k, v in st.items()}
    toks, inj, phases = [], [], []
    for s in samples:
        st, (tok, _lp, emitted, injected) = advance_rows(st, rows, jnp.asarray([s], jnp.int32), jnp.zeros(1))
        if bool(emitted[0]):
            toks.append(int(tok[0]))
            inj.append(bool(injected[0]))
            phases.append(int(st["phase"][0]))
    return toks, inj, phases, FINISH_NAMES.get(int(st["finish"][0]))


def test_budget_interrupts_then_answer_budget_ends_for_length():
    toks, inj, phases, fin = _run([4, 7, 0, 0, 8, 8, 8, 8], budget=2)
    # two thinking tokens, the two interruption ids forced (the samples 0, 0 are ignored), two answer tokens
    assert toks == [4, 7, 9, 10, 8, 8] and inj == [False, False, True, True, False, False]
    assert phases == [PH_THINK, PH_INJECT, PH_INJECT, PH_ANSWER, PH_ANSWER, PH_ANSWER] and fin == "length"


def test_stop_while_answering_counts_as_interrupted():
    toks, inj, _, fin = _run([4, 7, 0, 0, 1, 8], budget=2)
    assert toks == [4, 7, 9, 10, 1] and fin == "interrupted"


def test_think_end_before_budget_is_plain_generation():
    toks, inj, phases, fin = _run([5, 6, 8, 8, 1, 8], budget=3)
    assert toks == [5, 6, 8, 8, 1] and not any(inj) and phases[1:] == [PH_FREE] * 4 and fin == "stop"


def test_stop_while_thinking_and_max_new_tokens():
    assert _run([4, 1, 8], budget=2)[3] == "stop"
    toks, _, _, fin = _run([8] * 10, budget=None, lc=None, max_new=4)  # no length control: max_new_tokens only
    assert toks == [8, 8, 8, 8] and fin == "length"


def test_scatter_rows_writes_slots_and_drops_padding():
    cache = tuple({n: jnp.zeros((3, 1, 4, 2)) for n in ("k", "v")} for _ in range(2))  # per layer [B, K, S, Dh]
    new = tuple({n: jnp.arange(8, dtype=jnp.float32).reshape(2, 1, 2, 2) + 1 + 100 * i for n in ("k", "v")}
                for i in range(2))
    out = _scatter_rows(cache, new, jnp.asarray([2, 3]))  # slot 3 >= B: bucket padding, dropped
    for i in range(2):  # each layer's rows land in its own buffer
        k = np.asarray(out[i]["k"])
        np.testing.assert_array_equal(k[2, 0, :2], np.asarray(new[i]["k"])[0, 0])
        assert not k[:2].any() and not k[2, 0, 2:].any()
