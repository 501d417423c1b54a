"""SGLangGenerator: retries with back-off, failover, exactly-once results, response mapping, the in-flight
weight update on a real server, client-side interruption, and payloads vs SGLang's own dataclasses."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from scalerl_jax.rollout.protocol import INJECTED_VERSION, GenerationRequest, LengthControl, SamplingParams
from scalerl_jax.rollout.sglang_client import GenerationError, SGLangGenerator
from scalerl_jax.rollout.sglang_wire import generate_payload
from tests.test_server import free_port, kill, reply_json, save_random_checkpoint, start_server, wait_healthy

# ---- a tiny fake SGLang server (only for the client's retry/failover logic) -------------------------------


def _fake_output(body: dict, j: int, version: str = "default", mangle: str | None = None) -> dict:
    """What real SGLang returns for one sample: output = prompt reversed (so outputs identify prompts).
    ``mangle``: "no_logprobs" drops output_token_logprobs; "prefix_output_ids" puts prompt tokens in front of
    output_ids, as SGLang 0.5.3 does."""
    ids = list(reversed(body["input_ids"]))[: body["sampling_params"].get("max_new_tokens", 16)]
    meta = {"id": f"x{j}", "finish_reason": {"type": "length", "length": len(ids)}, "prompt_tokens": len(ids),
            "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": version}
    if body.get("return_logprob") and mangle != "no_logprobs":
        meta["output_token_logprobs"] = [[-0.5 - k, t, None] for k, t in enumerate(ids)]
    out_ids = body["input_ids"][-2:] + ids if mangle == "prefix_output_ids" else ids
    return {"text": "", "output_ids": out_ids, "meta_info": meta}


class FakeSGLang:
    """``fail_first``: that many /generate calls answer 503; ``drop_all``: close the connection without an answer
    (a server dying mid-request); ``status``: a fixed error status for every call."""

    def __init__(self, fail_first: int = 0, drop_all: bool = False, status: int | None = None, version="default",
                 mangle: str | None = None):
        self.fail_first, self.drop_all, self.status, self.version = fail_first, drop_all, status, version
        self.mangle = mangle
        self.calls: list[dict] = []
        self.times: list[float] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.calls.append(body)
                    fake.times.append(time.monotonic())
                    k = len(fake.calls)
                if fake.drop_all:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if fake.status is not None or k <= fake.fail_first:
                    return self._send(fake.status or 503, {"object": "error", "message": "try later"})
                n = body["sampling_params"].get("n", 1)
                outs = [_fake_output(body, j, fake.version, fake.mangle) for j in range(n)]
                self._send(200, outs[0] if n == 1 else outs)

            def _send(self, code, obj):
                reply_json(self, code, obj)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fakes():
    made = []

    def make(**kw):
        made.append(FakeSGLang(**kw))
        return made[-1]

    yield make
    for f in made:
        f.close()


def _reqs(k: int, n: int = 1, max_new: int = 8) -> list[GenerationRequest]:
    return [GenerationRequest([2 + i, 3 + i, 4 + i], SamplingParams(max_new_tokens=max_new, n=n), request_id=f"r{i}")
            for i in range(k)]


# ---- retries, back-off, failover, exactly once -------------------------------------------------------------


def test_retries_with_exponential_backoff_then_succeeds(fakes):
    srv = fakes(fail_first=3)
    with SGLangGenerator(srv.url, max_retries=3, backoff_s=0.1, concurrency=1, timeout_s=10) as gen:
        (comps,) = gen.generate(_reqs(1))
    assert len(srv.calls) == 4 and comps[0].token_ids == [4, 3, 2]
    gaps = [b - a for a, b in zip(srv.times, srv.times[1:])]
    for gap, want in zip(gaps, (0.1, 0.2, 0.4)):  # doubling back-off (plus at most 10 % jitter)
        assert want <= gap < want * 1.1 + 0.15, gaps


def test_gives_up_after_max_retries_and_400_is_not_retried(fakes):
    srv = fakes(fail_first=100)
    with SGLangGenerator(srv.url, max_retries=2, backoff_s=0.01, timeout_s=10) as gen, \
            pytest.raises(GenerationError, match="after 3 attempts"):
        gen.generate(_reqs(1))
    assert len(srv.calls) == 3
    bad = fakes(status=400)
    with SGLangGenerator(bad.url, max_retries=5, backoff_s=0.01, timeout_s=10) as gen, \
            pytest.raises(GenerationError, match="HTTP 400"):
        gen.generate(_reqs(1))
    assert len(bad.calls) == 1


def test_failover_from_dead_and_dying_servers_exactly_once(fakes):
    """A closed port and a server that drops every connection mid-request: everything lands on the live one."""
    live, dying = fakes(), fakes(drop_all=True)
    dead_url = f"http://127.0.0.1:{free_port()}"
    reqs = _reqs(12, n=2)
    with SGLangGenerator([dead_url, dying.url, live.url], max_retries=4, backoff_s=0.02, concurrency=6,
                         timeout_s=10) as gen:
        results = gen.generate(reqs)
    assert len(dying.calls) >= 1  # in-flight requests on the dying server were re-sent
    prompts_served = sorted(tuple(c["input_ids"]) for c in live.calls)
    assert prompts_served == sorted(tuple(r.prompt_ids) for r in reqs)  # each request completed once, on `live`
    for r, comps in zip(reqs, results):
        assert [c.sample_index for c in comps] == [0, 1] and all(c.request_id == r.request_id for c in comps)
        assert all(c.token_ids == list(reversed(r.prompt_ids)) for c in comps)


def test_maps_plain_sglang_responses(fakes):
    """No extension fields: tokens and logprobs from the triples; every token gets the client's version at submit
    time, or the server's weight_version when that is older (a stale server): never a newer one."""
    srv = fakes(version="12")
    with SGLangGenerator(srv.url, timeout_s=10, server_length_control=True, version=12) as gen:
        (comps,) = gen.generate(_reqs(1, max_new=2))
    c = comps[0]
    assert c.token_ids == [4, 3] and c.logprobs == [-0.5, -1.5] and c.versions == [12, 12]
    assert c.injected == [False, False] and c.finish_reason == "length" and c.truncated
    body = srv.calls[0]
    assert body["input_ids"] == [2, 3, 4] and body["return_logprob"] is True
    assert body["sampling_params"] == {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 2, "n": 1,
                                       "ignore_eos": True}
    for client_version, want in ((4, 4), (15, 12)):  # server newer than the client: the client's; older: its own
        with SGLangGenerator(srv.url, timeout_s=10, version=client_version) as gen:
            assert gen.generate(_reqs(1, max_new=1))[0][0].versions == [want]
    # "default" (SGLang before any update: weights this trainer never pushed, e.g. a server restarted outside the
    # run) -> the base model's version 0, never the client's: staleness must not be under-counted
    srv2 = fakes()
    with SGLangGenerator(srv2.url, timeout_s=10, version=4) as gen:
        assert gen.generate(_reqs(1, max_new=1))[0][0].versions == [0]


def test_malformed_and_mismatched_responses_are_retried(fakes):
    """A response without usable log-probs is a failed attempt (retried elsewhere), not a hard error; output_ids
    that disagree with the log-prob ids (SGLang 0.5.3 prefixes prompt tokens) do not matter."""
    bad = fakes(mangle="no_logprobs")
    good = fakes(mangle="prefix_output_ids")
    with SGLangGenerator([bad.url, good.url], max_retries=3, backoff_s=0.01, timeout_s=10, concurrency=1) as gen:
        results = gen.generate(_reqs(4, max_new=3))
        stats = gen.stats_snapshot()
    for i, (comps,) in enumerate(results):
        assert comps.token_ids == [4 + i, 3 + i, 2 + i]
    assert len(bad.calls) >= 1 and stats["retries"] == len(bad.calls)
    assert stats["output_ids_mismatches"] == len(good.calls) == 4


def test_dropped_length_control_falls_back_to_client_interruption(fakes):
    """A server said to do length control (server_length_control=True) answers without our fields, as anything
    that drops length_control would: the request is redone with client-side interruption, which happens."""
    srv = fakes()
    lc = LengthControl(think_end_ids=(99,), interruption_ids=(15, 16), budget_lo=2, budget_hi=2, answer_budget=2)
    req = GenerationRequest([2, 3, 4], SamplingParams(max_new_tokens=10), request_id="f")
    with SGLangGenerator(srv.url, timeout_s=10, length=lc, server_length_control=True) as gen:
        (comps,) = gen.generate([req])
        stats = gen.stats_snapshot()
    c = comps[0]
    # the fake answers the prompt reversed: [4, 3] up to the budget, then [16, 15] after the interruption
    assert c.token_ids == [4, 3, 15, 16, 16, 15] and c.injected == [False, False, True, True, False, False]
    assert c.think_budget == 2 and stats["length_fallbacks"] == 1 and stats["client_interruptions"] == 1
    assert ["length_control" in b for b in srv.calls] == [True, False, False]


# ---- against our real server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("client")
    ckpt_b = save_random_checkpoint(tmp / "b", 11)
    proc, url = start_server(tmp, "--preset", "tiny", "--init-seed", "10", "--max-batch", "8", "--decode-chunk", "4",
                             "--debug-chunk-delay-ms", "60")
    try:
        wait_healthy(url, proc)
        yield url, ckpt_b
    finally:
        kill(proc)


def test_in_flight_weight_update_sequence(real):
    url, ckpt_b = real
    # one request with n=3: one HTTP call, hence one engine batch
    reqs = [GenerationRequest([3, 12, 4, 13, 5, 14], SamplingParams(max_new_tokens=40, n=3), request_id="w")]
    with SGLangGenerator(url, timeout_s=60, concurrency=4) as gen:
        gen.generate([GenerationRequest([3, 12], SamplingParams(max_new_tokens=2))])  # compile before timing
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("r", gen.generate(reqs)))
        t.start()
        deadline = time.monotonic() + 30
        while httpx.get(url + "/stats").json()["engine_batches"] < 1 or not _in_flight(url):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.2)  # a few chunks into the batch
        gen.update_weights(str(ckpt_b), 7)
        t.join()
        assert gen.weight_version == 7
    events = [e for e in httpx.get(url + "/stats").json()["events"]]
    names = [e["event"] for e in events]
    assert names == ["pause_generation", "update_weights_from_disk", "continue_generation"]
    assert events[0]["mode"] == "in_place" and events[0]["in_flight"] == 1 and events[1]["halted"] is True
    assert events[1]["weight_version"] == "7"
    assert httpx.get(url + "/get_weight_version").json() == {"weight_version": "7"}
    (comps,) = out["r"]
    assert len(comps) == 3
    for c in comps:
        v = c.versions
        assert len(v) == 40 and v[0] == 0 and v[-1] == 7 and v == sorted(v), v  # old prefix, new suffix


def _in_flight(url: str) -> bool:
    s = httpx.get(url + "/stats").json()
    return s["generate_requests"] > s["engine_batches"] + s["aborted_requests"]


def test_client_side_interruption_matches_server_semantics(real):
    """Sampled (temperature 0.5), both paths: the think-end id is one that no prompt's greedy first 3 tokens contain,
    so the prompts are built to run past their budget; interruption must fire on each path, and every interrupted
    completion has the injected text at exactly its budget."""
    url, _ = real
    prompts = [[3 + i, 12, 4, 14] for i in range(3)]
    with SGLangGenerator(url, timeout_s=60, concurrency=4) as gen:
        heads = [c[0].token_ids for c in gen.generate(
            [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=3)) for p in prompts])]
    think_end = next(t for t in range(16, 1, -1) if t != 15 and all(t not in h for h in heads))
    # prompt + budget + interruption <= 9 tokens keeps the client's second call in the same compiled shape
    lc = LengthControl(think_end_ids=(think_end,), interruption_ids=(15, think_end), budget_lo=2, budget_hi=3,
                       answer_budget=4)
    reqs = [GenerationRequest(p, SamplingParams(temperature=0.5, max_new_tokens=20, n=2), request_id=f"i{i}")
            for i, p in enumerate(prompts)]
    for server_side in (True, False):
        with SGLangGenerator(url, timeout_s=60, concurrency=4, length=lc, server_length_control=server_side) as gen:
            results = gen.generate(reqs)
        interrupted = 0
        for comps in results:
            assert len(comps) == 2
            for c in comps:
                assert 2 <= c.think_budget <= 3
                b = c.think_budget
                sampled_head = c.token_ids[:b]
                if any(c.injected):
                    interrupted += 1
                    assert think_end not in sampled_head and c.injected[b : b + 2] == [True, True]
                    assert c.token_ids[b : b + 2] == [15, think_end]
                    assert c.versions[b : b + 2] == [INJECTED_VERSION] * 2
                    assert c.logprobs[b : b + 2] == [0.0, 0.0] and sum(c.injected) == 2
                    assert len(c.token_ids) <= b + 2 + 4
                    assert c.finish_reason in ("interrupted", "length")
                else:
                    assert think_end in sampled_head
        assert interrupted >= 1, ("interruption never fired", server_side)


def test_client_side_interruption_equals_the_engine_token_for_token(real):
    """Greedy decoding makes both paths deterministic: for every budget, the client's two-round interruption must give
    exactly what the engine's own state machine gives, and the part before the budget must be the plain greedy
    output (the hand-derived reference: thinking ends at the first think-end token, or the text is cut at the
    budget and the interruption ids follow)."""
    url, _ = real
    prompts = [[3, 12, 4, 14], [5, 13, 6, 14], [7, 12, 2, 13, 9, 14]]
    with SGLangGenerator(url, timeout_s=60, concurrency=8) as gen:
        plain = [c[0] for c in gen.generate([GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=14))
                                              for p in prompts])]
    checked = {"interrupted": 0, "ended": 0}
    for prompt, ref in zip(prompts, plain):
        think_end = (ref.token_ids[2],)  # thinking "ends" at its first occurrence in the greedy text
        first_end = ref.token_ids.index(think_end[0]) + 1
        for budget in (1, 2, 3, 5):
            lc = LengthControl(think_end_ids=think_end, interruption_ids=(15, 16), budget_lo=budget, budget_hi=budget,
                               answer_budget=3)
            req = GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=14, n=2), length=lc)
            got = {}
            for server_side in (True, False):
                with SGLangGenerator(url, timeout_s=60, concurrency=8, server_length_control=server_side) as gen:
                    got[server_side] = gen.generate([req])[0]
            for a, b in zip(got[True], got[False]):
                assert (a.token_ids, a.injected, a.finish_reason, a.think_budget) == (
                    b.token_ids, b.injected, b.finish_reason, b.think_budget), (budget, a, b)
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
                if first_end <= budget:
                    assert not any(b.injected) and b.token_ids == ref.token_ids
                    checked["ended"] += 1
                else:
                    assert b.token_ids[:budget] == ref.token_ids[:budget]
                    assert b.token_ids[budget: budget + 2] == [15, 16] and b.injected[budget: budget + 2] == [True] * 2
                    assert len(b.token_ids) <= budget + 2 + 3
                    checked["interrupted"] += 1
    assert checked["ended"] and checked["interrupted"]


def test_abort_pause_returns_abort_and_client_resends(real):
    """pause(abort) mid-batch: the server answers abort (SGLang's shape); the client re-sends it after continue."""
    url, _ = real
    req = GenerationRequest([5, 12, 6, 14], SamplingParams(max_new_tokens=40), request_id="ab")
    raw: dict = {}
    body = generate_payload(req.prompt_ids, req.params)
    t = threading.Thread(target=lambda: raw.setdefault("r", httpx.post(url + "/generate", json=body, timeout=60)))
    t.start()
    time.sleep(0.3)
    assert httpx.post(url + "/pause_generation", json={"mode": "abort"}).status_code == 200
    t.join()
    assert raw["r"].status_code == 200 and raw["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    httpx.post(url + "/continue_generation", json={})

    with SGLangGenerator(url, timeout_s=60, max_retries=10, backoff_s=0.1) as gen:
        th = threading.Thread(target=lambda: raw.setdefault("c", gen.generate([req])))
        th.start()
        time.sleep(0.3)
        httpx.post(url + "/pause_generation", json={"mode": "abort"})
        time.sleep(0.3)  # paused: the re-sent request waits
        assert "c" not in raw
        httpx.post(url + "/continue_generation", json={})
        th.join()
        assert gen.stats["retries"] >= 1 and gen.stats["resent_aborted"] == 0  # no update: a plain retry
    (c,) = raw["c"][0]
    assert c.finish_reason == "length" and len(c.token_ids) == 40


# ---- payloads vs SGLang's own request dataclasses ------------------------------------------------------------


def test_payloads_validate_against_sglang_dataclasses():
    try:
        from sglang.srt.managers.io_struct import GenerateReqInput, UpdateWeightFromDiskReqInput
    except Exception as e:  # noqa: BLE001 - any import failure means: not available here
        pytest.skip(f"sglang is not importable ({type(e).__name__}: {e}); it cannot be installed on CPU machines")
    import dataclasses

    body = generate_payload([1, 2, 3], SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5, n=2,
                                                      stop_token_ids=(1,)))
    fields = {f.name for f in dataclasses.fields(GenerateReqInput)}
    assert set(body) <= fields, set(body) - fields
    obj = GenerateReqInput(**body)
    obj.normalize_batch_and_arguments()
    from sglang.srt.sampling.sampling_params import SamplingParams as SGSamplingParams

    SGSamplingParams(**body["sampling_params"]).verify(vocab_size=17)
    import sglang

    from scalerl_jax.rollout.sglang_wire import ServerCaps, parse_release

    caps = ServerCaps("http://x", version=sglang.__version__, release=parse_release(sglang.__version__))
    with SGLangGenerator("http://127.0.0.1:9") as gen:
        pause, upd = caps.update_bodies("/ckpt", 3, gen.pause_mode)
    ufields = {f.name for f in dataclasses.fields(UpdateWeightFromDiskReqInput)}
    assert set(upd) <= ufields, set(upd) - ufields
    UpdateWeightFromDiskReqInput(**upd)
    if pause:
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        PauseGenerationReqInput(**pause)
