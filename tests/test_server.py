"""The SGLang-API server as a real subprocess: response shape, logprobs vs the model, weight updates, 400s.

References are independent of the server: greedy tokens and their log-probs are checked against a
teacher-forced :func:`scalerl_jax.models.forward` pass over prompt + output, and a loaded checkpoint's
outputs against the in-process engine built from the same checkpoint file.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from scalerl_jax.models import load_hf_checkpoint
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams
from tests.servers import ROOT, assert_greedy_against_model, checkpoint_pair, kill, post, start_server, wait_healthy
from tests.tolerances import max_logit, model_logprob_tol

PROMPTS = [[3, 12, 4, 13, 5, 14], [11, 10, 12, 2, 14], [7, 7, 13, 9, 14], [4, 14]]  # <= 9 tokens: one shape bucket


# ---- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return checkpoint_pair(tmp_path_factory, "ckpts", 1, 2)


@pytest.fixture(scope="module")
def server(ckpts, tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("logs"), "--model", str(ckpts[0]), "--max-batch", "8",
                             "--decode-chunk", "4")
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        kill(proc)


def _generate(url: str, body: dict, status: int = 200):
    return post(url, "/generate", body, status).json()


# ---- tests -------------------------------------------------------------------------------------------------


def test_generate_has_sglang_shape_and_model_logprobs(server, ckpts):
    params, cfg = load_hf_checkpoint(ckpts[0])
    out = _generate(server, {"input_ids": PROMPTS[0], "sampling_params": {"temperature": 0, "max_new_tokens": 12},
                             "return_logprob": True, "rid": "abc"})
    assert isinstance(out, dict) and set(out) >= {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["id"] == "abc" and meta["prompt_tokens"] == len(PROMPTS[0])
    assert meta["completion_tokens"] == len(out["output_ids"]) == len(meta["output_token_logprobs"])
    assert meta["weight_version"] == "0" and isinstance(meta["weight_version"], str)
    fr = meta["finish_reason"]
    if fr["type"] == "length":
        assert fr["length"] == 12 == len(out["output_ids"])
    else:
        assert fr == {"type": "stop", "matched": 1} and out["output_ids"][-1] == 1  # eos of tiny
    for triple, t in zip(meta["output_token_logprobs"], out["output_ids"]):
        assert len(triple) == 3 and triple[1] == t and triple[2] is None
    assert_greedy_against_model(params, cfg, PROMPTS[0], out["output_ids"],
                                [t[0] for t in meta["output_token_logprobs"]])
    assert meta["output_token_versions"] == [0] * len(out["output_ids"])
    assert meta["output_token_injected"] == [False] * len(out["output_ids"])


def test_batch_and_n_return_prompt_major_list(server, ckpts):
    params, cfg = load_hf_checkpoint(ckpts[0])
    out = _generate(server, {"input_ids": PROMPTS[:2], "sampling_params": {"temperature": 0, "max_new_tokens": 6,
                                                                          "n": 2}, "return_logprob": True})
    assert isinstance(out, list) and len(out) == 4
    for k, o in enumerate(out):
        prompt = PROMPTS[k // 2]
        assert o["meta_info"]["prompt_tokens"] == len(prompt)
        assert_greedy_against_model(params, cfg, prompt, o["output_ids"],
                                    [t[0] for t in o["meta_info"]["output_token_logprobs"]])
    assert len({o["meta_info"]["id"] for o in out}) == 4
    # a single prompt with n > 1 is also a list; per-prompt sampling_params lists are accepted
    out = _generate(server, {"input_ids": PROMPTS[2], "sampling_params": {"max_new_tokens": 3, "n": 3}})
    assert isinstance(out, list) and len(out) == 3 and all("output_token_logprobs" not in o["meta_info"] for o in out)
    sps = [{"max_new_tokens": 2}, {"max_new_tokens": 5, "stop_token_ids": []}]
    out = _generate(server, {"input_ids": PROMPTS[:2], "sampling_params": sps})
    assert [o["meta_info"]["completion_tokens"] <= m for o, m in zip(out, (2, 5))] == [True, True]


def test_stop_token_ids_stop_generation(server):
    first = _generate(server, {"input_ids": PROMPTS[1], "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    t0 = first["output_ids"][0]
    out = _generate(server, {"input_ids": PROMPTS[1], "sampling_params": {"temperature": 0, "max_new_tokens": 8,
                                                                         "stop_token_ids": [t0]}})
    assert out["output_ids"] == [t0]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": t0}


def test_length_control_extension(server):
    """A prompt built to exceed its budget must be interrupted: the think-end id is one that greedy decoding does not
    emit in the first 3 tokens (read from a plain request), so the engine has to inject the interruption text at
    exactly 3 sampled tokens; and one whose think-end id is the 2nd greedy token must end thinking by itself."""
    plain = _generate(server, {"input_ids": PROMPTS[3], "sampling_params": {"temperature": 0, "max_new_tokens": 3}})
    head = plain["output_ids"]
    assert len(head) == 3
    think_end = next(t for t in range(16, 1, -1) if t not in head and t != 15)
    lc = {"think_end_ids": [think_end], "interruption_ids": [15, think_end], "budget_lo": 3, "budget_hi": 3,
          "answer_budget": 4}
    out = _generate(server, {"input_ids": PROMPTS[3], "sampling_params": {"temperature": 0, "max_new_tokens": 20},
                             "length_control": lc, "return_logprob": True})
    meta = out["meta_info"]
    assert meta["think_budget"] == 3
    inj = meta["output_token_injected"]
    # interrupted exactly at the budget: the 3 greedy tokens, then the 2 injected ids, then at most 4 answer tokens
    assert out["output_ids"][:3] == head and inj[:5] == [False, False, False, True, True]
    assert out["output_ids"][3:5] == [15, think_end] and sum(inj) == 2
    assert meta["output_token_versions"][3:5] == [-1, -1]
    assert [t[0] for t in meta["output_token_logprobs"][3:5]] == [0.0, 0.0]
    assert len(out["output_ids"]) <= 3 + 2 + 4
    # thinking that ends within the budget (the 2nd greedy token is the think-end id) is not interrupted
    ended = dict(lc, think_end_ids=[head[1]], interruption_ids=[15, head[1]])
    out2 = _generate(server, {"input_ids": PROMPTS[3], "sampling_params": {"temperature": 0, "max_new_tokens": 20},
                              "length_control": ended})
    assert not any(out2["meta_info"]["output_token_injected"]) and out2["output_ids"][:2] == head[:2]
    bad = _generate(server, {"input_ids": PROMPTS[3], "sampling_params": {"max_new_tokens": 5}, "length_control": lc},
                    400)
    assert "budget_hi" in bad["message"]


@pytest.mark.parametrize("body, needle", [
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [3, 17]}, "outside the vocabulary"),
    ({"input_ids": [3, -1]}, "outside the vocabulary"),
    ({"input_ids": [[3], []]}, "empty"),
    ({"input_ids": [3, "x"]}, "integer"),
    ({"input_ids": "3 4"}, "input_ids"),
    ({"input_ids": [3], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"input_ids": [3], "sampling_params": {"max_new_tokens": "8"}}, "max_new_tokens"),
    ({"input_ids": [3], "sampling_params": {"temperature": -0.5}}, "temperature"),
    ({"input_ids": [3], "sampling_params": {"top_p": 0}}, "top_p"),
    ({"input_ids": [3], "sampling_params": {"n": 0}}, "n"),
    ({"input_ids": [3], "sampling_params": {"stop_token_ids": [99]}}, "stop_token_ids"),
    ({"input_ids": [3], "sampling_params": {"max_new_tokens": 1000}}, "max_len"),
    ({"input_ids": [3]}, "max_new_tokens 128"),  # SGLang's default, longer than the tiny model's 64 positions
    ({"input_ids": [3], "sampling_params": {"max_new_tokens": 1, "max_tokens": 1}}, "unknown field `max_tokens`"),
    ({"input_ids": [3], "sampling_params": {"max_new_tokens": 1, "top_k": 4}}, "top_k"),
    ({"input_ids": [3], "sampling_params": {"max_new_tokens": 1, "frequency_penalty": 0.5}}, "frequency_penalty"),
    ({"input_ids": [3], "sampling_params": {"max_new_tokens": 1, "ignore_eos": "no"}}, "ignore_eos"),
    ({"input_ids": [[3], [4]], "rid": ["a"]}, "rid"),
    ({"input_ids": [3], "image_data": "x.png"}, "image_data"),
    ({"input_ids": [3], "sampling_params": []}, "sampling_params"),
    ({"input_ids": [3], "return_logprob": "yes"}, "return_logprob"),
    ({"sampling_params": {}}, "input_ids"),
    ([1, 2, 3], "JSON object"),
])
def test_bad_requests_get_400_and_server_keeps_serving(server, body, needle):
    r = httpx.post(server + "/generate", json=body, timeout=30.0)
    assert r.status_code == 400, r.text
    assert r.json()["object"] == "error" and needle in r.json()["message"]
    assert _generate(server, {"input_ids": [3], "sampling_params": {"max_new_tokens": 1}})["meta_info"]


def test_malformed_json_and_bad_control_calls_get_400(server):
    for route, raw in [("/generate", b'{"input_ids": [3,'), ("/generate", b"\xff\xfe"),
                       ("/update_weights_from_disk", b"{}"), ("/pause_generation", b'{"mode": "sideways"}'),
                       ("/update_weights_from_disk", b'{"model_path": "/nonexistent/ckpt", "weight_version": "3"}'),
                       ("/update_weights_from_disk", b'{"model_path": "/tmp", "load_format": "dummy"}'),
                       ("/update_weights_from_disk", b'{"model_path": "/tmp", "flush_cache": "yes"}')]:
        r = httpx.post(server + route, content=raw, headers={"content-type": "application/json"}, timeout=30.0)
        assert r.status_code == 400, (route, raw, r.text)
        assert r.json().get("message")
    assert httpx.get(server + "/get_weight_version").json() == {"weight_version": "0"}
    assert httpx.get(server + "/health").status_code == 200
    assert httpx.get(server + "/health_generate").status_code == 200


def test_model_info_and_text_input(server):
    info = httpx.get(server + "/get_model_info").json()
    assert info["is_generation"] is True and "length_control" in info["scalerl_extensions"]
    assert info["vocab_size"] == 17 and info["weight_version"] == "0"
    out = _generate(server, {"text": "12+3=", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert out["meta_info"]["prompt_tokens"] == 5


def test_update_weights_from_disk_changes_version_and_outputs(server, ckpts):
    """Outputs after the update equal the in-process engine on checkpoint B (and differ from A's)."""
    body = {"input_ids": PROMPTS, "sampling_params": {"temperature": 0, "max_new_tokens": 10}, "return_logprob": True}
    before = _generate(server, body)
    r = httpx.post(server + "/update_weights_from_disk",
                   json={"model_path": str(ckpts[1]), "weight_version": "5", "flush_cache": True}, timeout=60.0)
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert httpx.get(server + "/get_weight_version").json() == {"weight_version": "5"}
    after = _generate(server, body)
    assert all(o["meta_info"]["weight_version"] == "5" for o in after)
    assert all(o["meta_info"]["output_token_versions"] == [5] * len(o["output_ids"]) for o in after)
    assert [o["output_ids"] for o in before] != [o["output_ids"] for o in after]

    engine = JaxEngine.from_hf(ckpts[1], max_batch=8, max_len=64, decode_chunk=4)
    # the server stops at the model's EOS, as SGLang does; the engine only at the stop ids it is given
    sp = SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(engine.cfg.eos_token_id,))
    ref = engine.generate([GenerationRequest(p, sp) for p in PROMPTS])
    params_b, cfg = load_hf_checkpoint(ckpts[1])
    for o, cs, p in zip(after, ref, PROMPTS):
        assert o["output_ids"] == cs[0].token_ids
        # the server's batch and this engine's: two float32 orderings of the model (tests/tolerances.py)
        tol = model_logprob_tol(cfg, 64, max_logit(params_b, cfg, p + cs[0].token_ids))
        np.testing.assert_allclose([t[0] for t in o["meta_info"]["output_token_logprobs"]], cs[0].logprobs, rtol=0,
                                   atol=tol)
    for o, p in zip(after, PROMPTS):
        lps = [t[0] for t in o["meta_info"]["output_token_logprobs"]]
        assert_greedy_against_model(params_b, cfg, p, o["output_ids"], lps)
    # and back to A: the first outputs come back
    r = httpx.post(server + "/update_weights_from_disk", json={"model_path": str(ckpts[0]), "weight_version": "6"},
                   timeout=60.0)
    assert r.json()["success"] is True
    assert [o["output_ids"] for o in _generate(server, body)] == [o["output_ids"] for o in before]


def test_cli_help_explains_options():
    out = subprocess.run([sys.executable, "-m", "scalerl_jax.serve", "--help"], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
    assert out.returncode == 0
    for opt in ("--preset", "--model", "--port", "--max-batch", "--max-len", "--decode-chunk", "--weight-version"):
        assert opt in out.stdout
