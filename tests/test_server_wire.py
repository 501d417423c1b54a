"""scalerl_jax/rollout/server/wire.py as pure functions: /generate bodies parsed into requests (batches, rids,
sampling fields, length control and its budget check), control bodies, and the response's fields. The served
routes are covered by test_server.py and test_sglang_api_fields.py."""

from __future__ import annotations

import pytest

from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.protocol import INJECTED_VERSION, Completion
from scalerl_jax.rollout.server.wire import (
    BadRequest,
    completion_to_sglang,
    finish_reason_json,
    parse_generate_body,
    parse_pause_mode,
    parse_update_body,
    weight_version_spans,
)

V, MAX_LEN, EOS = 16, 256, (1,)
LC = {"think_end_ids": [5], "interruption_ids": [9, 10], "budget_lo": 2, "budget_hi": 8, "answer_budget": 4}


def _parse(body):
    return parse_generate_body(body, V, MAX_LEN, eos_token_ids=EOS)


def test_batch_rids_sampling_lists_and_defaults():
    reqs, opts = _parse({"input_ids": [[3, 4], [5]], "rid": "x", "return_logprob": True,
                         "sampling_params": [{"max_new_tokens": 3, "n": 2}, {"temperature": 0, "ignore_eos": True}]})
    assert [r.request_id for r in reqs] == ["x_0", "x_1"] and opts.return_logprob and not opts.single
    assert reqs[0].params.max_new_tokens == 3 and reqs[0].params.n == 2 and reqs[0].params.stop_token_ids == EOS
    assert reqs[1].params.max_new_tokens == 128 and reqs[1].params.temperature == 0.0  # SGLang's default
    assert reqs[1].params.stop_token_ids == ()  # ignore_eos disables EOS and stop_token_ids
    (one,), opts = _parse({"input_ids": [2, 3], "sampling_params": {"max_new_tokens": None, "top_k": 1}})
    assert opts.single and one.params.max_new_tokens == MAX_LEN - 2 and one.params.temperature == 0.0


def test_length_control_is_parsed_and_its_budget_checked_once():
    (req,), _ = _parse({"input_ids": [2], "sampling_params": {"max_new_tokens": 14}, ws.LENGTH_CONTROL: LC})
    assert req.length.interruption_ids == (9, 10) and req.length.budget_hi == 8 and req.length.answer_budget == 4
    # 8 + 2 + 4 = 14: one token less is refused, with the sum
    with pytest.raises(BadRequest, match=r"the prompt: with length_control, max_new_tokens 13 .* = 14"):
        _parse({"input_ids": [2], "sampling_params": {"max_new_tokens": 13}, ws.LENGTH_CONTROL: LC})
    with pytest.raises(BadRequest, match=r"length_control.budget_lo must be >= 1"):
        _parse({"input_ids": [2], ws.LENGTH_CONTROL: {**LC, "budget_lo": 0}})
    with pytest.raises(BadRequest, match=r"length_control.interruption_ids\[1\] = 16 is outside the vocabulary"):
        _parse({"input_ids": [2], ws.LENGTH_CONTROL: {**LC, "interruption_ids": [9, 16]}})


@pytest.mark.parametrize("body,needle", [
    ({"input_ids": []}, "input_ids must be a non-empty list"),
    ({"input_ids": [3, 99]}, r"input_ids\[1\] = 99 is outside the vocabulary"),
    ({"input_ids": [3], "sampling_params": {"max_new_tokens": 256}}, "exceeds the server's max_len 256"),
    ({"input_ids": [3], "sampling_params": {"bogus": 1}}, "unknown field `bogus`"),
    ({"input_ids": [3], "sampling_params": {"min_p": 0.1}}, "min_p = 0.1 is not supported"),
    ({"input_ids": [3], "image_data": "x"}, "image_data is not supported"),
    ({"text": "hi"}, "this server has no tokenizer"),
    ({"input_ids": [[3], [4]], "rid": ["a"]}, "rid has 1 entries for 2 prompts"),
])
def test_bad_bodies_name_the_field(body, needle):
    with pytest.raises(BadRequest, match=needle):
        _parse(body)


def test_control_bodies():
    assert parse_pause_mode({}) == "abort" and parse_pause_mode({"mode": "in_place"}) == "in_place"
    for mode in ws.PAUSE_MODES:
        assert parse_pause_mode({"mode": mode}) == mode
    with pytest.raises(BadRequest, match="mode must be one of"):
        parse_pause_mode({"mode": "later"})
    assert parse_update_body({"model_path": "/m", "weight_version": "7", "flush_cache": False}) == "7"
    with pytest.raises(BadRequest, match="model_path"):
        parse_update_body({"weight_version": "7"})


def test_weight_version_spans_hand_worked():
    # injected tokens join the span before them (or after them, at the start)
    assert weight_version_spans([3, 3, INJECTED_VERSION, 4, 4]) == [
        {"version": "3", "start": 0, "end": 3}, {"version": "4", "start": 3, "end": 5}]
    assert weight_version_spans([INJECTED_VERSION, 2], {2: "v2"}) == [{"version": "v2", "start": 0, "end": 2}]
    assert weight_version_spans([], current="5") == [{"version": "5", "start": 0, "end": 0}]


def test_response_fields_and_finish_reasons():
    c = Completion(request_id="r", sample_index=0, prompt_ids=[2], token_ids=[4, 9, 10, 1], logprobs=[-1.0, 0, 0, -2],
                   versions=[0, -1, -1, 0], injected=[False, True, True, False], finish_reason="interrupted",
                   truncated=False, think_budget=1)
    assert finish_reason_json(c) == {"type": "stop", "matched": 1}  # SGLang knows no "interrupted"
    out = completion_to_sglang(c, rid="r", return_logprob=True, weight_version="0", e2e=0.5)
    meta = out["meta_info"]
    assert set(ws.META_EXTENSIONS) <= set(meta) and meta[ws.FINISH_REASON] == "interrupted"
    assert meta[ws.OUTPUT_TOKEN_INJECTED] == [False, True, True, False] and meta[ws.THINK_BUDGET] == 1
    assert meta["output_token_logprobs"] == [[-1.0, 4, None], [0.0, 9, None], [0.0, 10, None], [-2.0, 1, None]]
    assert meta["completion_tokens"] == 4 and out["output_ids"] == [4, 9, 10, 1]
