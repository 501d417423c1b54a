"""scalerl_jax/rollout/engine/rows.py: request validation (each bad field named), the per-slot host arrays (a row's
constants and initial state, right-aligned think-end windows kept right-aligned when the arrays grow), and the
submission handle."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from scalerl_jax.rollout.engine.rows import (
    Row,
    Submission,
    copy_slots,
    empty_completion,
    empty_slots,
    fill_slot,
    validate_requests,
)
from scalerl_jax.rollout.length_rule import NO_BUDGET, PH_FREE, PH_THINK
from scalerl_jax.rollout.protocol import GenerationRequest, LengthControl, SamplingParams

LC = LengthControl(think_end_ids=(5, 6), interruption_ids=(9,), budget_lo=2, budget_hi=4, answer_budget=3)


def _req(prompt, max_new=8, stops=(), lc=None):
    return GenerationRequest(prompt_ids=prompt, params=SamplingParams(max_new_tokens=max_new, stop_token_ids=stops),
                             length=lc, request_id="q")


@pytest.mark.parametrize("req,needle", [
    (_req([]), "prompt_ids is empty"),
    (_req([3, 20]), "prompt token id 20 is outside the vocabulary"),
    (_req([3] * 17, max_new=0), "prompt has 17 tokens, longer than the engine's max_len 16"),
    (_req([3] * 10, max_new=7), r"prompt length 10 \+ max_new_tokens 7 exceeds the engine's max_len 16"),
    (_req([3], stops=(16,)), "stop token id 16 is outside"),
    (_req([3], lc=LengthControl((5,), (16,), 1, 2, 0)), "length-control token id 16 is outside"),
    (_req([3], max_new=7, lc=LC), r"max_new_tokens 7 is below .* = 8"),  # 4 + 1 + 3
])
def test_validate_requests_names_the_request_and_field(req, needle):
    validate_requests([_req([3])], vocab_size=16, max_len=16)  # a good one passes
    with pytest.raises(ValueError, match=r"request 1 \(id 'q'\): " + needle):
        validate_requests([_req([3]), req], vocab_size=16, max_len=16)


def _row(sub, lc, budget, prompt=(3, 4)):
    return Row(sub, 0, 0, list(prompt), 0.5, 0.9, 8, (1, 2), lc, budget, np.asarray([7, 8], np.uint32), 3)


def test_fill_slot_writes_every_field_and_copy_keeps_windows_right_aligned():
    sub = Submission([_req([3, 4], lc=LC)], None, 1)
    consts, st = empty_slots(2, 3, 3, 2)
    fill_slot(consts, st, 1, _row(sub, LC, 3))
    assert consts["budget"][1] == 3 and consts["ans_budget"][1] == 3 and consts["inter_len"][1] == 1
    assert consts["think_end"][1].tolist() == [-1, 5, 6] and consts["think_mask"][1].tolist() == [False, True, True]
    assert consts["stop"][1].tolist() == [1, 2, -1] and consts["key"][1].tolist() == [7, 8]
    assert st["tok"][1] == 4 and st["pos"][1] == 1 and st["phase"][1] == PH_THINK and not st["done"][1]
    assert st["done"][0] and consts["budget"][0] == NO_BUDGET  # the other slot stays empty
    # the arrays grow (B 2 -> 3, windows 3 -> 5): the think end stays against the newest tokens
    consts2, _ = empty_slots(3, 4, 5, 2)
    copy_slots(consts2, consts)
    assert consts2["think_end"][1].tolist() == [-1, -1, -1, 5, 6]
    assert consts2["stop"][1].tolist() == [1, 2, -1, -1]
    # a slot is reused by a row without length control: every field is written again
    fill_slot(consts, st, 1, _row(sub, None, None, prompt=(3,)))
    assert consts["budget"][1] == NO_BUDGET and st["phase"][1] == PH_FREE and not consts["think_mask"][1].any()
    assert st["pos"][1] == 0


def test_submission_finishes_once_and_waits():
    done = []
    sub = Submission([_req([3]), _req([4])], done.append, 1)
    with pytest.raises(TimeoutError):
        sub.wait(0.01)
    r0, r1 = _row(sub, None, None), Row(sub, 1, 0, [4], 1.0, 1.0, 8, (), None, None, np.zeros(2, np.uint32), 1)
    assert sub._add(r0, empty_completion(r0, "abort", 1.0)) == []
    assert sub._add(r1, empty_completion(r1, "length", 2.0)) == [sub]
    t = threading.Thread(target=sub._finish)
    t.start()
    t.join()
    sub._finish()  # a second finish runs on_done no more
    out = sub.wait(1.0)
    assert done == [sub] and [c[0].finish_reason for c in out] == ["abort", "length"]
    assert out[1][0].truncated and out[0][0].token_ids == [] and out[1][0].timing["done"] == 2.0
