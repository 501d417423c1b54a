"""Field-by-field compatibility with real SGLang's native HTTP API, as RL trainers use it.

Every list below is transcribed from SGLang's own source (the release and file are named next to it; the wheels
are the ones on PyPI, the router source is sgl-project/sglang at the named commit). The tests fail when what our
client sends, or what our server answers, drops or renames one of these fields.

Two kinds of test:

- our client's request bodies against SGLang's and sglang-router's request types (pure);
- our real server (a subprocess on loopback) against SGLang's response and control-route fields, and our client
  against the response shapes of older releases. For the latter a thin proxy in front of the real server rewrites
  what only an older release does (``output_ids`` absent or prefixed with prompt tokens, no
  ``weight_versions``, pause without ``mode`` aborting in-flight requests); generation itself stays real, and
  tokens are checked against a teacher-forced pass of the model.
"""

from __future__ import annotations

import itertools
import threading
import time

import httpx
import jax
import pytest

from scalerl_jax.models import init_params, load_hf_checkpoint, tiny
from scalerl_jax.rollout.client import SGLangGenerator
from scalerl_jax.rollout.client.wire import ServerCaps, devices_from_server_info, generate_payload, parse_release
from scalerl_jax.rollout.protocol import GenerationRequest, LengthControl, SamplingParams
from tests.servers import (
    ReleaseProxy,
    assert_greedy_against_model,
    checkpoint_pair,
    kill,
    post,
    start_server,
    wait_healthy,
    wait_until,
)
from tests.tolerances import ops

# ---- transcribed from SGLang ----------------------------------------------------------------------------------

# python/sglang/srt/managers/io_struct.py, GenerateReqInput (+ BaseReq.rid), sglang 0.5.3 wheel
GENERATE_REQ_053 = {
    "rid", "text", "input_ids", "input_embeds", "image_data", "video_data", "audio_data", "sampling_params",
    "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs",
    "stream", "log_metrics", "return_hidden_states", "modalities", "session_params", "lora_path", "lora_id",
    "custom_logit_processor", "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
    "data_parallel_rank", "background", "conversation_id", "priority", "extra_key", "no_logs", "custom_labels",
    "return_bytes",
}
# python/sglang/srt/managers/io_struct.py, GenerateReqInput, sglang 0.4.10.post2 wheel
GENERATE_REQ_0410 = {
    "text", "input_ids", "input_embeds", "image_data", "video_data", "audio_data", "sampling_params", "rid",
    "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs",
    "stream", "log_metrics", "modalities", "lora_path", "session_params", "custom_logit_processor",
    "return_hidden_states", "bootstrap_host", "bootstrap_port", "bootstrap_room", "data_parallel_rank",
}
# python/sglang/api/v1/api_types.py, GenerateRequest (the JSON contract of /generate), sglang 0.5.23 wheel
GENERATE_REQ_0523 = {
    "rid", "text", "input_ids", "stream", "sampling_params", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "token_ids_logprob", "return_hidden_states", "return_text_in_logprobs", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "routed_dp_rank",
    "disagg_prefill_dp_rank", "image_data", "mm_hashes", "video_data", "audio_data", "extra_key", "priority",
    "cache_salt", "require_reasoning", "lora_path", "session_params", "kv_hints", "routing_key",
    "max_thinking_tokens", "session_id", "custom_logit_processor", "custom_labels", "images_config",
    "return_prompt_token_ids", "routed_experts_start_len", "return_sampling_mask", "modalities",
}
# sgl-router src/protocols/generate.rs, GenerateRequest (sgl-project/sglang 0cf8354957043b314cc87bb004e9c62155746adc),
# the same 35-field struct compiled into sglang-router 0.3.2 (the one installed here; plus "model"). The router
# re-serialises this struct: any other field is dropped (seen with 0.3.2 on loopback).
ROUTER_GENERATE_REQ = {
    "model", "text", "input_ids", "input_embeds", "image_data", "video_data", "audio_data", "sampling_params",
    "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs",
    "stream", "log_metrics", "return_hidden_states", "modalities", "session_params", "lora_path", "lora_id",
    "custom_logit_processor", "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
    "data_parallel_rank", "background", "conversation_id", "priority", "extra_key", "no_logs", "custom_labels",
    "return_bytes", "return_entropy", "rid",
}
# What sglang-router 0.3.2 adds to every /generate it forwards (seen on loopback): our server must accept them
ROUTER_ADDED_TOP_LEVEL = {"model": None, "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
                          "return_hidden_states": False, "background": False, "no_logs": False, "return_bytes": False,
                          "return_entropy": False}
# python/sglang/srt/sampling/sampling_params.py, SamplingParams.__init__ and its defaults, sglang 0.5.3 wheel
SAMPLING_053 = {
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
    "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
    "ignore_eos": False, "skip_special_tokens": True, "spaces_between_special_tokens": True, "no_stop_trim": False,
    "custom_params": None, "stream_interval": None, "logit_bias": None, "sampling_seed": 42,
}
# python/sglang/api/v1/api_types.py, SamplingParams ("unknown keys rejected") and its defaults, sglang 0.5.23
SAMPLING_0523 = {
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "stop_regex": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": 1073741824, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None, "ebnf": None,
    "structural_tag": None, "ignore_eos": False, "skip_special_tokens": True, "spaces_between_special_tokens": True,
    "no_stop_trim": False, "stream_interval": None, "logit_bias": {}, "sampling_seed": None, "custom_params": None,
    "beam_width": None, "watermark": None, "choice": [],
}
# sgl-router src/protocols/sampling_params.rs (sgl-project/sglang 921724eb7bc8d33648bc67268bb10b70a5b3ef0c); the
# 19-field struct of sglang-router 0.3.2. Other sampling keys are dropped by the router.
ROUTER_SAMPLING = {
    "temperature", "max_new_tokens", "top_p", "top_k", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "stop", "ignore_eos", "skip_special_tokens", "json_schema", "regex", "ebnf", "min_p",
    "min_new_tokens", "stop_token_ids", "no_stop_trim", "n", "sampling_seed",
}
# python/sglang/srt/managers/tokenizer_manager.py, _handle_batch_output's meta_info (+ e2e_latency when finished,
# + output_token_logprobs from convert_logprob_style), sglang 0.5.3 wheel
META_053 = {"id", "finish_reason", "prompt_tokens", "weight_version", "completion_tokens", "cached_tokens",
            "e2e_latency"}
META_053_LOGPROB = {"output_token_logprobs"}
# sglang 0.5.23 wheel: the same, plus weight_versions (utils/weight_versions.py add_weight_versions_to_meta_info)
META_0523 = META_053 | {"weight_versions"}
# python/sglang/api/v1/api_types.py, WeightVersionSpan, sglang 0.5.23
WEIGHT_VERSION_SPAN = {"version", "start", "end"}
# python/sglang/srt/managers/schedule_batch.py, FINISH_MATCHED_TOKEN / FINISH_LENGTH / FINISH_ABORT .to_json
# (identical in 0.5.3 and 0.5.23)
FINISH_KEYS = {"stop": {"type", "matched"}, "length": {"type", "length"},
               "abort": {"type", "message", "status_code", "err_type"}}
# python/sglang/srt/managers/io_struct.py, UpdateWeightFromDiskReqInput (+ BaseReq.rid), per release
UPDATE_0410 = {"model_path", "load_format", "abort_all_requests"}
UPDATE_053 = {"rid", "model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
              "torch_empty_cache", "keep_pause"}
UPDATE_056 = UPDATE_053 | {"recapture_cuda_graph", "token_step", "flush_cache"}
UPDATE_0523 = UPDATE_056 | {"manifest"}
# python/sglang/srt/entrypoints/http_server.py, update_weights_from_disk's response content (0.5.3 and 0.5.23)
UPDATE_RESPONSE = {"success", "message", "num_paused_requests"}
# python/sglang/srt/managers/io_struct.py, PauseGenerationReqInput.mode (0.5.6 first, 0.5.23), ContinueGeneration-
# ReqInput (0.5.23), AbortReq (0.5.3, 0.5.23); http_server.py pause/continue responses
PAUSE_MODES = {"abort", "retract", "in_place"}
CONTINUE_REQ = {"torch_empty_cache"}
ABORT_REQ = {"rid", "abort_all"}
PAUSE_RESPONSE = {"message", "status"}
# python/sglang/srt/entrypoints/http_server.py, get_model_info, sglang 0.5.3 wheel
MODEL_INFO_053 = {"model_path", "tokenizer_path", "is_generation", "preferred_sampling_params", "weight_version"}
# python/sglang/srt/entrypoints/http_server.py, model_info, sglang 0.5.23 wheel
MODEL_INFO_0523 = MODEL_INFO_053 | {
    "served_model_name", "load_format", "reasoning_parser", "tool_call_parser", "disaggregation_mode",
    "has_image_understanding", "has_audio_understanding", "model_type", "architectures",
}
# /get_server_info fields sglang-router 0.3.2 reads (its ServerInfo struct) that real SGLang's ServerArgs has
# (python/sglang/srt/server_args.py, 0.4.10.post2 and 0.5.3), and "version" (http_server.py get_server_info)
SERVER_INFO_ROUTER_READS = {"model_path", "served_model_name", "tp_size", "dp_size", "load_balance_method",
                            "disaggregation_mode", "max_prefill_tokens", "max_running_requests", "version"}
# ServerArgs fields a client needs for device accounting and limits (server_args.py, 0.5.3)
SERVER_INFO_MORE = {"pp_size", "ep_size", "enable_dp_attention", "context_length", "tokenizer_path",
                    "skip_tokenizer_init", "weight_version"}
# python/sglang/srt/managers/io_struct.py, GetLoadReqOutput, sglang 0.5.3 wheel
GET_LOAD = {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
# SGLang's native error body: http_server.py _create_error_response (0.5.3, 0.5.23)
ERROR_BODY = {"error"}

INIT_SEED = 21
LC = LengthControl(think_end_ids=(16,), interruption_ids=(15, 16), budget_lo=2, budget_hi=3, answer_budget=4)


# ---- the client's request bodies --------------------------------------------------------------------------


def test_client_generate_body_uses_only_sglang_and_router_fields():
    p = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5, n=2, stop_token_ids=(1,))
    for body in (generate_payload([3, 4], p), generate_payload([3, 4], SamplingParams(max_new_tokens=3))):
        assert set(body) <= GENERATE_REQ_053 & GENERATE_REQ_0410 & GENERATE_REQ_0523 & ROUTER_GENERATE_REQ
        assert set(body["sampling_params"]) <= set(SAMPLING_053) & set(SAMPLING_0523) & ROUTER_SAMPLING
        assert body["return_logprob"] is True and body["stream"] is False
    # without stop ids: ignore_eos so that SGLang generates to max_new_tokens like the embedded engine
    assert generate_payload([3], SamplingParams(max_new_tokens=3))["sampling_params"]["ignore_eos"] is True
    assert "ignore_eos" not in generate_payload([3], p)["sampling_params"]  # stop ids given: EOS stops too
    # our extension is not a field of SGLang nor of the router: the router drops it (hence the client-side path)
    ext = generate_payload([3], p, length=LC)
    assert set(ext) - GENERATE_REQ_0523 - ROUTER_GENERATE_REQ == {"length_control"}


@pytest.mark.parametrize("version, pause, update_fields", [
    ("0.4.10.post2", set(), UPDATE_0410 | {"weight_version"}),  # weight_version: ignored there, but harmless
    ("0.5.3", set(), UPDATE_053),
    ("0.5.5.post3", set(), UPDATE_053),
    ("0.5.6", {"mode"}, UPDATE_056),
    ("0.5.23", {"mode"}, UPDATE_0523),
])
def test_update_bodies_follow_the_release(version, pause, update_fields):
    caps = ServerCaps("http://x", version=version, release=parse_release(version))
    with SGLangGenerator("http://127.0.0.1:9") as gen:
        pause_body, update_body = caps.update_bodies("/ckpt", 7, gen.pause_mode)
    assert set(pause_body) == pause and set(pause_body.values()) <= PAUSE_MODES
    assert set(update_body) <= update_fields and {"model_path", "weight_version"} <= set(update_body)
    assert update_body["weight_version"] == "7"  # SGLang's weight_version is a string
    if "flush_cache" in update_fields:
        assert update_body["flush_cache"] is False  # in place: 0.5.23 fails the update if it must flush
    else:
        assert "flush_cache" not in update_body
    assert parse_release("0.5.3.post1") == (0, 5, 3) and parse_release("scalerl_jax") is None


def test_devices_from_server_info():
    # ServerArgs fields as /get_server_info reports them (server_args.py): tp_size * pp_size * dp_size, where DP
    # attention keeps the DP ranks inside the TP group
    assert devices_from_server_info({"tp_size": 2, "pp_size": 1, "dp_size": 4, "enable_dp_attention": False}) == 8
    assert devices_from_server_info({"tp_size": 8, "pp_size": 2, "dp_size": 8, "enable_dp_attention": True}) == 16
    assert devices_from_server_info({"tp_size": 1, "dp_size": 1, "device_count": 3}) == 3  # ours
    assert devices_from_server_info({"model_path": "m"}) is None


# ---- our real server -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Checkpoint A (the servers' initial random weights, seed INIT_SEED) and B (another seed)."""
    return checkpoint_pair(tmp_path_factory, "fields_ckpts", INIT_SEED, INIT_SEED + 1)


def _server(tmp_path_factory, name: str, delay_ms: int):
    tmp = tmp_path_factory.mktemp(name)
    proc, url = start_server(tmp, "--preset", "tiny", "--init-seed", str(INIT_SEED), "--max-batch", "8",
                             "--decode-chunk", "4", "--debug-chunk-delay-ms", str(delay_ms), name=name)
    try:
        wait_healthy(url, proc)
    except BaseException:
        kill(proc)
        raise
    return proc, url


@pytest.fixture(scope="module")
def srv(tmp_path_factory, ckpts):
    """Our server with weights A at version "0" (a test that changes them puts them back)."""
    proc, url = _server(tmp_path_factory, "fields", 30)
    try:
        yield url, ckpts[1]
    finally:
        kill(proc)


@pytest.fixture(scope="module")
def params_a():
    return init_params(tiny(), jax.random.PRNGKey(INIT_SEED))


def test_generate_response_fields(srv, params_a):
    url, _ = srv
    cfg = tiny()
    prompt = [3, 12, 4, 13]
    out = post(url, "/generate", {"input_ids": prompt, "rid": "f1", "return_logprob": True,
                                   "sampling_params": {"temperature": 0, "max_new_tokens": 6}}).json()
    assert isinstance(out, dict) and {"text", "output_ids", "meta_info"} <= set(out)
    meta = out["meta_info"]
    assert META_0523 | META_053_LOGPROB <= set(meta), sorted(META_0523 | META_053_LOGPROB - set(meta))
    assert meta["id"] == "f1" and isinstance(meta["weight_version"], str)
    ftype = meta["finish_reason"]["type"]
    assert set(meta["finish_reason"]) == FINISH_KEYS[ftype]
    ids = [t[1] for t in meta["output_token_logprobs"]]
    assert all(len(t) == 3 and t[2] is None for t in meta["output_token_logprobs"]) and ids == out["output_ids"]
    assert meta["completion_tokens"] == len(ids) and meta["prompt_tokens"] == len(prompt)
    assert_greedy_against_model(params_a, cfg, prompt, ids, [t[0] for t in meta["output_token_logprobs"]])
    if ftype == "stop":  # the model's EOS stops generation, as in SGLang
        assert meta["finish_reason"]["matched"] == cfg.eos_token_id == ids[-1]
    else:
        assert meta["finish_reason"]["length"] == 6 == len(ids)
    spans = meta["weight_versions"]
    assert all(set(s) == WEIGHT_VERSION_SPAN for s in spans) and spans[0]["start"] == 0
    assert spans[-1]["end"] == len(ids) and all(a["end"] == b["start"] for a, b in itertools.pairwise(spans))

    # a batch with a string rid: one rid per prompt; with n, a prompt-major list
    outs = post(url, "/generate", {"input_ids": [prompt, [5, 6]], "rid": "b", "return_text_in_logprobs": True,
                                    "return_logprob": True, "sampling_params": {"max_new_tokens": 2, "n": 2,
                                                                                "ignore_eos": True}}).json()
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [4, 4, 2, 2]
    assert len({o["meta_info"]["id"] for o in outs}) == 4 and all(o["meta_info"]["id"].startswith("b_") for o in outs)
    # the tiny tokenizer's text of every token
    assert all(isinstance(t[2], str) for o in outs for t in o["meta_info"]["output_token_logprobs"])
    assert all(o["meta_info"]["finish_reason"] == {"type": "length", "length": 2} for o in outs)

    # what the router adds to every request is accepted; prompt_token_ids on request (0.5.23)
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}, "return_prompt_token_ids": True,
            **ROUTER_ADDED_TOP_LEVEL}
    assert post(url, "/generate", body).json()["prompt_token_ids"] == prompt

    # errors come in SGLang's native shape
    err = post(url, "/generate", {"input_ids": []}, 400).json()
    assert ERROR_BODY <= set(err) and err["error"]["message"]


def test_every_sglang_sampling_field_is_accepted_and_unknown_ones_are_refused(srv):
    url, _ = srv
    for defaults in (SAMPLING_053, SAMPLING_0523):
        sp = {**defaults, "max_new_tokens": 3, "ignore_eos": True}
        out = post(url, "/generate", {"input_ids": [3, 4], "sampling_params": sp, "return_logprob": True}).json()
        assert out["meta_info"]["completion_tokens"] == 3
    r = post(url, "/generate", {"input_ids": [3], "sampling_params": {"max_new_tokens": 1, "bogus": 1}}, 400)
    assert "unknown field `bogus`" in r.json()["error"]["message"]
    # values the engine cannot honour are refused, not silently ignored
    for sp in ({"top_k": 5}, {"min_p": 0.1}, {"repetition_penalty": 1.2}, {"stop": ["#"]}, {"min_new_tokens": 2},
               {"regex": "a+"}, {"logit_bias": {"3": 1.0}}):
        r = post(url, "/generate", {"input_ids": [3], "sampling_params": {"max_new_tokens": 4, **sp}}, 400)
        assert "not supported" in r.json()["error"]["message"], sp
    for top in ({"top_logprobs_num": 2, "return_logprob": True}, {"lora_path": "x"}, {"return_hidden_states": True}):
        post(url, "/generate", {"input_ids": [3], "sampling_params": {"max_new_tokens": 1}, **top}, 400)


def test_sampling_defaults_and_eos_semantics(srv, params_a):
    url, _ = srv
    cfg = tiny()
    # max_new_tokens defaults to 128, which the tiny server's 64-token sequences cannot hold
    r = post(url, "/generate", {"input_ids": [3, 4]}, 400)
    assert "max_new_tokens 128" in r.json()["error"]["message"]
    # null: up to the end of the sequence (SGLang's scheduler caps it at the context length)
    out = post(url, "/generate", {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": None,
                                                                           "ignore_eos": True}}).json()
    assert out["meta_info"]["completion_tokens"] == cfg.max_seq_len - 2
    # the model's EOS stops generation unless ignore_eos, which also disables stop_token_ids (SGLang's
    # Req.check_finished); the reference is a teacher-forced greedy pass
    prompt = [9, 12, 2, 14]
    free = post(url, "/generate", {"input_ids": prompt, "return_logprob": True, "sampling_params": {
        "temperature": 0, "max_new_tokens": 40, "ignore_eos": True, "stop_token_ids": [5]}}).json()
    ids = free["output_ids"]
    assert len(ids) == 40 and free["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert_greedy_against_model(params_a, cfg, prompt, ids, [t[0] for t in free["meta_info"]["output_token_logprobs"]])
    eos = cfg.eos_token_id
    stopped = post(url, "/generate", {"input_ids": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": 40, "stop_token_ids": [5]}}).json()
    first = next((i for i, t in enumerate(ids) if t in (eos, 5)), None)
    if first is None:
        assert stopped["output_ids"] == ids
    else:
        assert stopped["output_ids"] == ids[: first + 1]
        assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[first]}


def test_control_routes_fields(srv, ckpts):
    url, ckpt_b = srv
    ckpt_a = ckpts[0]
    mi = httpx.get(url + "/get_model_info").json()
    assert MODEL_INFO_0523 <= set(mi), sorted(MODEL_INFO_0523 - set(mi))
    assert httpx.get(url + "/model_info").json().keys() == mi.keys()
    si = httpx.get(url + "/get_server_info").json()
    assert SERVER_INFO_ROUTER_READS | SERVER_INFO_MORE <= set(si), sorted(SERVER_INFO_ROUTER_READS - set(si))
    assert si["tp_size"] * si["pp_size"] * si["dp_size"] == si["device_count"] == 1  # one CPU device, no sharding
    assert httpx.get(url + "/server_info").status_code == 200
    for method in ("GET", "POST"):
        r = httpx.request(method, url + "/flush_cache")
        assert r.status_code == 200 and r.text.startswith("Cache flushed")
    assert set(httpx.get(url + "/get_load").json()[0]) >= GET_LOAD
    assert post(url, "/abort_request", dict.fromkeys(ABORT_REQ, None) | {"rid": "", "abort_all": True}).text == ""
    for mode in PAUSE_MODES:
        assert PAUSE_RESPONSE <= set(post(url, "/pause_generation", {"mode": mode}).json())
        assert PAUSE_RESPONSE <= set(post(url, "/continue_generation", dict.fromkeys(CONTINUE_REQ, True)).json())

    # every field of UpdateWeightFromDiskReqInput (0.5.23) is accepted; weight_version is any string
    body = {"rid": None, "model_path": str(ckpt_b), "load_format": None, "abort_all_requests": False,
            "weight_version": "step-B", "is_async": False, "torch_empty_cache": False, "keep_pause": False,
            "recapture_cuda_graph": False, "token_step": 0, "flush_cache": True, "manifest": None}
    assert set(body) == UPDATE_0523
    res = post(url, "/update_weights_from_disk", body).json()
    assert set(res) == UPDATE_RESPONSE and res["success"] is True and "step-B" in res["message"]
    assert httpx.get(url + "/get_model_info").json()["weight_version"] == "step-B"
    assert httpx.get(url + "/get_model_info").json()["model_path"] == str(ckpt_b)  # SGLang reports the new path
    out = post(url, "/generate", {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    meta = out.json()["meta_info"]
    assert meta["weight_version"] == "step-B" and meta["weight_versions"] == [{"version": "step-B", "start": 0,
                                                                                "end": 3}]
    v = meta["output_token_versions"]
    assert len(set(v)) == 1 and v[0] >= 1  # an integer version internally, newer than the initial 0
    res = post(url, "/update_weights_from_disk", {"model_path": str(ckpt_b), "weight_version": "12"}).json()
    assert res["success"] is True
    meta = post(url, "/generate", {"input_ids": [3], "sampling_params": {"max_new_tokens": 2,
                                                                          "ignore_eos": True}}).json()["meta_info"]
    assert meta["output_token_versions"] == [12, 12] and meta["weight_version"] == "12"
    bad = post(url, "/update_weights_from_disk", {"model_path": "/nonexistent"}, 400).json()
    assert set(bad) == UPDATE_RESPONSE and bad["success"] is False
    # back to weights A, version "0", for the tests below
    assert post(url, "/update_weights_from_disk", {"model_path": str(ckpt_a), "weight_version": "0"}).json()["success"]


# ---- our client against the response shapes of real releases ---------------------------------------------------

@pytest.fixture
def proxies(srv):
    made = []

    def make(release):
        made.append(ReleaseProxy(srv[0], release))
        return made[-1]

    yield make
    for p in made:
        p.close()


def _greedy_reqs(k: int, max_new: int) -> list[GenerationRequest]:
    return [GenerationRequest([2 + i, 12, 3 + i, 14], SamplingParams(temperature=0.0, max_new_tokens=max_new),
                              request_id=f"g{i}") for i in range(k)]


def _check_greedy(params, reqs, results):
    for req, comps in zip(reqs, results):
        for c in comps:
            assert len(c.token_ids) == req.params.max_new_tokens  # no stop ids: ignore_eos, to max_new_tokens
            assert_greedy_against_model(params, tiny(), req.prompt_ids, c.token_ids, c.logprobs)


@pytest.mark.parametrize("release", ["0.4.10.post2", "0.5.3", "0.5.5", "0.5.23"])
def test_client_reads_each_release(proxies, params_a, release):
    """Tokens from the log-prob ids, whatever output_ids says; versions the client's at submit time; interruption
    done by the client (the release has no length_control), and it happens."""
    px = proxies(release)
    reqs = _greedy_reqs(3, 5)
    with SGLangGenerator(px.url, timeout_s=60, max_retries=0) as gen:
        results = gen.generate(reqs)
        assert gen.server_caps(px.url).release == parse_release(release)
        stats = gen.stats_snapshot()
    _check_greedy(params_a, reqs, results)
    assert all(c.versions == [0] * 5 for cs in results for c in cs)
    assert stats["output_ids_mismatches"] == (3 if release == "0.5.3" else 0) and stats["retries"] == 0

    # think_end_ids longer than the budget: thinking cannot end in time, so every sample is interrupted
    lc = LengthControl(think_end_ids=(16, 16, 16, 16), interruption_ids=(15, 16), budget_lo=2, budget_hi=3,
                       answer_budget=3)
    prompt = [4, 12, 5]
    with SGLangGenerator(px.url, timeout_s=60, length=lc) as gen:
        (comps,) = gen.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=20))])
        assert gen.stats["client_interruptions"] == 1
    c = comps[0]
    b = c.think_budget
    assert 2 <= b <= 3 and len(c.token_ids) == b + 2 + 3 and c.finish_reason == "length" and c.truncated
    assert c.token_ids[b : b + 2] == [15, 16] and c.injected == [False] * b + [True, True] + [False] * 3
    assert c.versions[b : b + 2] == [-1, -1] and c.logprobs[b : b + 2] == [0.0, 0.0]
    assert_greedy_against_model(params_a, tiny(), prompt, c.token_ids[:b], c.logprobs[:b])
    assert_greedy_against_model(params_a, tiny(), prompt + c.token_ids[: b + 2], c.token_ids[b + 2 :],
                                c.logprobs[b + 2 :])
    assert not any("length_control" in body for body in px.bodies["/generate"])


@pytest.fixture(scope="module")
def fresh_srv(tmp_path_factory, ckpts):
    """A second server, slower per chunk, for the tests that update weights mid-request."""
    proc, url = _server(tmp_path_factory, "fresh", 100)  # 48 tokens take >= 1.2 s: time to update mid-way
    try:
        yield url, ckpts[1]
    finally:
        kill(proc)


def _version(url: str) -> int:
    return int(httpx.get(url + "/get_weight_version").json()["weight_version"])


def _chunks(url: str) -> int:
    return int(httpx.get(url + "/stats").json().get("decode_chunks", 0))


def _wait_generating(url: str, since: int, chunks: int = 2, timeout_s: float = 60.0) -> None:
    """Until the server has run ``chunks`` decode chunks since ``since`` (compilation included in the wait)."""
    wait_until(lambda: _chunks(url) >= since + chunks, timeout_s, "the requests never started", 0.02)


def _greedy_under(params, req, c) -> bool:
    try:
        assert_greedy_against_model(params, tiny(), req.prompt_ids, c.token_ids, c.logprobs)
    except AssertionError:
        return False
    return True


def test_update_on_a_release_without_pause_modes_resends_aborted_requests(fresh_srv, params_a):
    """0.5.3: pause aborts in-flight requests. They are re-sent without counting as retries (max_retries=0 still
    completes them) and run again from scratch on the new weights; their tokens are tagged with the version at
    submit time, never the newer one. A request that ended before the pause arrived (a loaded machine can be that
    slow: 48 tokens take 1.2 s) keeps what the old weights gave it: every request is greedy under exactly one of the
    two checkpoints, and those under the new one are the re-sent ones."""
    url, ckpt_b = fresh_srv
    v0 = _version(url)
    px = ReleaseProxy(url, "0.5.3")
    try:
        reqs = _greedy_reqs(2, 48)
        out: dict = {}
        with SGLangGenerator(px.url, timeout_s=120, max_retries=0, concurrency=4, version=v0) as gen:
            c0 = _chunks(url)
            t = threading.Thread(target=lambda: out.setdefault("r", gen.generate(reqs)))
            t.start()
            _wait_generating(url, c0)  # a few chunks in
            gen.update_weights(str(ckpt_b), v0 + 7)
            t.join()
            stats = gen.stats_snapshot()
            assert gen.weight_version == v0 + 7
        assert px.bodies["/pause_generation"] == [{}]  # no mode on 0.5.3
        assert "flush_cache" not in px.bodies["/update_weights_from_disk"][0]
        assert stats["resent_aborted"] >= 1 and stats["retries"] == 0
        params_b = load_hf_checkpoint(ckpt_b)[0]
        on_b = 0
        for req, (c,) in zip(reqs, out["r"]):
            assert len(c.token_ids) == 48  # no stop ids: ignore_eos, to max_new_tokens
            under = (_greedy_under(params_a, req, c), _greedy_under(params_b, req, c))
            assert sum(under) == 1, f"{req.request_id}: greedy under old {under[0]}, new {under[1]}: not one model"
            on_b += under[1]
        assert on_b == stats["resent_aborted"]  # the re-sent requests ran on the new weights, from scratch
        assert all(c.versions == [v0] * 48 for cs in out["r"] for c in cs)  # conservative: v0 <= v0 + 7
    finally:
        px.close()


def test_weight_versions_spans_give_per_token_versions(fresh_srv):
    """0.5.23's meta_info.weight_versions spans, without our output_token_versions: an in-flight update (pause in
    place) gives each token the version of the weights that produced it, as the server's own extension says."""
    url, ckpt_b = fresh_srv
    v0 = _version(url)
    px = ReleaseProxy(url, "0.5.23")
    try:
        req = GenerationRequest([3, 12, 4, 13, 5, 14], SamplingParams(max_new_tokens=48, n=2), request_id="sp")
        out: dict = {}
        with SGLangGenerator(px.url, timeout_s=120, max_retries=0, version=v0) as gen:
            c0 = _chunks(url)
            t = threading.Thread(target=lambda: out.setdefault("r", gen.generate([req])))
            t.start()
            _wait_generating(url, c0)
            gen.update_weights(str(ckpt_b), v0 + 5)
            t.join()
            stats = gen.stats_snapshot()
        assert px.bodies["/pause_generation"] == [{"mode": "in_place"}]
        assert px.bodies["/update_weights_from_disk"][0]["flush_cache"] is False
        assert stats["resent_aborted"] == 0
        (comps,) = out["r"]
        raw = px.raw[-1]
        for c, o in zip(comps, raw):
            truth = o["meta_info"]["output_token_versions"]  # stripped by the proxy before the client saw it
            assert c.versions == truth and truth[0] == v0 and truth[-1] == v0 + 5, (c.versions, truth)
    finally:
        px.close()


def test_stats_snapshot_counts_tokens_and_busy_time_per_server(srv, proxies):
    url, _ = srv
    px = proxies("0.5.23")  # a second "server" (the same engine behind another URL)
    reqs = [GenerationRequest([3 + i, 12, 4], SamplingParams(max_new_tokens=4 + i % 3), request_id=f"s{i}")
            for i in range(6)]
    with SGLangGenerator([url, px.url], timeout_s=60, concurrency=3) as gen:
        t0 = time.monotonic()
        results = gen.generate(reqs)
        wall = time.monotonic() - t0
        snap = gen.stats_snapshot()
        assert gen.device_count() == 2  # one device per server (each reports it; the proxy as tp*pp*dp)
    total = sum(len(c.token_ids) for cs in results for c in cs)
    servers = snap["servers"]
    assert set(servers) == {url, px.url} and snap["tokens"] == total == sum(s["tokens"] for s in servers.values())
    assert sum(s["requests"] for s in servers.values()) == snap["attempts"] == len(reqs)
    for s in servers.values():
        # a server is busy only inside the client's wall time; 0.05 s covers where each clock reading sits in its
        # code path (a few statements, microseconds), not how fast the machine is
        assert 0 < s["busy_s"] <= wall + 0.05
        # the same float64 division on both sides: within gamma_1 of each other's exact value
        assert s["tokens_per_s"] == pytest.approx(s["tokens"] / s["busy_s"], rel=2 * ops(1, "float64"))
    assert snap["requests"] == len(reqs) and snap["retries"] == snap["failovers"] == snap["resent_aborted"] == 0
