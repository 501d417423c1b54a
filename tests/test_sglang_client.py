"""SGLangGenerator: retries with back-off, failover, exactly-once results, response mapping (a missing log-prob is
a bad response), the in-flight weight update on a real server, client-side interruption, payloads vs SGLang's own
dataclasses, and weight pushes confirmed worker by worker (a worker reporting another version is re-pushed, then
named in the error; one that missed a push tags its tokens with its real version, or is caught up first)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import jax
import pytest

from scalerl_jax.models import init_params, tiny
from scalerl_jax.rollout.client import GenerationError, RemoteGenerator, SGLangGenerator, WeightVersionMismatch
from scalerl_jax.rollout.client.wire import BadResponse, generate_payload, parse_sample
from scalerl_jax.rollout.protocol import INJECTED_VERSION, GenerationRequest, LengthControl, SamplingParams
from tests.servers import (
    START_S,
    ReleaseProxy,
    free_port,
    kill,
    reply_json,
    save_random_checkpoint,
    start_server,
    stats,
    wait_healthy,
    wait_until,
)
from tests.tolerances import max_logit, model_logprob_tol

# ---- a tiny fake SGLang server (only for the client's retry/failover logic) -------------------------------


def _fake_output(body: dict, j: int, version: str = "default", mangle: str | None = None) -> dict:
    """What real SGLang returns for one sample: output = prompt reversed (so outputs identify prompts).
    ``mangle``: "no_logprobs" drops output_token_logprobs; "prefix_output_ids" puts prompt tokens in front of
    output_ids, as SGLang 0.5.3 does; "null_logprob" sends null as the second token's log-prob; "short_logprobs"
    leaves the last token out of output_token_logprobs."""
    ids = list(reversed(body["input_ids"]))[: body["sampling_params"].get("max_new_tokens", 16)]
    meta = {"id": f"x{j}", "finish_reason": {"type": "length", "length": len(ids)}, "prompt_tokens": len(ids),
            "completion_tokens": len(ids), "cached_tokens": 0, "weight_version": version}
    if body.get("return_logprob") and mangle != "no_logprobs":
        meta["output_token_logprobs"] = [[-0.5 - k, t, None] for k, t in enumerate(ids)]
        if mangle == "null_logprob":
            meta["output_token_logprobs"][1][0] = None
        elif mangle == "short_logprobs":
            meta["output_token_logprobs"].pop()
    out_ids = body["input_ids"][-2:] + ids if mangle == "prefix_output_ids" else ids
    return {"text": "", "output_ids": out_ids, "meta_info": meta}


class FakeSGLang:
    """``fail_first``: that many /generate calls answer 503; ``drop_all``: close the connection without an answer
    (a server dying mid-request); ``status``: a fixed error status for every call. Control routes as SGLang 0.5.3
    has them: ``/pause_generation``, ``/update_weights_from_disk`` (it sets ``version``, except for the first
    ``stuck_updates`` calls, which answer success and change nothing), ``/continue_generation``, and
    ``/get_model_info`` / ``/get_weight_version`` reporting ``version``; every control call is in ``control``."""

    def __init__(self, fail_first: int = 0, drop_all: bool = False, status: int | None = None, version="default",
                 mangle: str | None = None, stuck_updates: int = 0):
        self.fail_first, self.drop_all, self.status, self.version = fail_first, drop_all, status, version
        self.mangle, self.stuck_updates = mangle, stuck_updates
        self.control: list[tuple[str, dict]] = []
        self.calls: list[dict] = []
        self.times: list[float] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path in ("/get_model_info", "/get_weight_version"):
                    return self._send(200, {"weight_version": fake.version})
                self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/generate":
                    return self._control(body)
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

            def _control(self, body):
                with fake.lock:
                    fake.control.append((self.path, body))
                    if self.path == "/update_weights_from_disk":
                        if fake.stuck_updates > 0:
                            fake.stuck_updates -= 1
                        else:
                            fake.version = body["weight_version"]
                if self.path in ("/pause_generation", "/update_weights_from_disk", "/continue_generation"):
                    return self._send(200, {"success": True, "message": "ok"})
                self._send(404, {"detail": "Not Found"})

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


def test_retries_with_exponential_backoff_then_succeeds(fakes, monkeypatch):
    import scalerl_jax.rollout.client.sglang as sg

    class Clock:  # the client's own clock, its sleeps recorded: the back-offs asked for, not how long a loaded
        def __getattr__(self, name):  # machine took to come back from them
            return getattr(time, name)

        def sleep(self, s):
            slept.append(s)
            time.sleep(s)

    slept: list[float] = []
    monkeypatch.setattr(sg, "time", Clock())
    srv = fakes(fail_first=3)
    with SGLangGenerator(srv.url, max_retries=3, backoff_s=0.1, concurrency=1, timeout_s=10) as gen:
        (comps,) = gen.generate(_reqs(1))
    assert len(srv.calls) == 4 and comps[0].token_ids == [4, 3, 2]
    assert len(slept) == 3, slept
    for s, want in zip(slept, (0.1, 0.2, 0.4)):  # doubling back-off, plus at most 10 % jitter
        assert want <= s <= want * 1.1, slept
    # and the server saw the attempts at least that far apart (later on a loaded machine, never sooner)
    gaps = [b - a for a, b in zip(srv.times, srv.times[1:])]
    assert all(gap >= s for gap, s in zip(gaps, slept)), (gaps, slept)


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


@pytest.mark.parametrize("mangle, needle", [
    ("null_logprob", "meta_info.output_token_logprobs[1][0] (the log-prob of output token 1) is null"),
    ("short_logprobs", "meta_info.output_token_logprobs has 2 entries for 3 output tokens"),
])
def test_missing_logprob_is_a_bad_response_retried_then_an_error(fakes, mangle, needle):
    """A null log-prob, or fewer log-probs than output tokens, is never read as 0 (p = 1): the attempt fails and is
    retried on another server; a server that always answers so gives an error naming the field and the position."""
    bad, good = fakes(mangle=mangle), fakes()
    with SGLangGenerator([bad.url, good.url], max_retries=3, backoff_s=0.01, timeout_s=10, concurrency=1) as gen:
        results = gen.generate(_reqs(4, max_new=3))
        stats = gen.stats_snapshot()
    for i, (comps,) in enumerate(results):  # the fake's log-probs: -0.5 - position
        assert comps.token_ids == [4 + i, 3 + i, 2 + i] and comps.logprobs == [-0.5, -1.5, -2.5]
    assert len(bad.calls) >= 1 and stats["retries"] == len(bad.calls) and len(good.calls) == 4
    only_bad = fakes(mangle=mangle)
    with SGLangGenerator(only_bad.url, max_retries=2, backoff_s=0.01, timeout_s=10) as gen, \
            pytest.raises(GenerationError, match="after 3 attempts") as err:
        gen.generate(_reqs(1, max_new=3))
    assert needle in str(err.value) and only_bad.url in str(err.value) and len(only_bad.calls) == 3


@pytest.mark.parametrize("entry, needle", [
    ([None, 5, None], "output_token_logprobs[2][0] (the log-prob of output token 2) is null"),
    ([float("nan"), 5, None], "output_token_logprobs[2][0] (the log-prob of output token 2) is nan"),
    ([float("-inf"), 5, None], "output_token_logprobs[2][0] (the log-prob of output token 2) is -inf"),
    ([-0.1, None, None], "output_token_logprobs[2][1] (the id of output token 2) is null"),
    ([-0.1], "output_token_logprobs[2] is not [logprob, token_id, text]"),
])
def test_parse_sample_names_the_bad_logprob_entry(entry, needle):
    o = {"meta_info": {"output_token_logprobs": [[-0.2, 3, None], [-0.3, 4, "x"], entry], "completion_tokens": 3}}
    with pytest.raises(BadResponse) as err:
        parse_sample(o, 0)
    assert needle in str(err.value)
    o["meta_info"]["output_token_logprobs"][2] = [-0.4, 5, None]
    s = parse_sample(o, 0)
    assert s.token_ids == [3, 4, 5] and s.logprobs == [-0.2, -0.3, -0.4]


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
    # 150 ms per 4-token chunk: a 40-token request runs for at least 1.5 s, so that a weight update sent a few chunks
    # in lands mid-generation with a second of room for a loaded machine's HTTP round trips
    proc, url = start_server(tmp, "--preset", "tiny", "--init-seed", "10", "--max-batch", "8", "--decode-chunk", "4",
                             "--debug-chunk-delay-ms", "150")
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
        deadline = time.monotonic() + START_S  # a hang guard
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


def test_a_push_gets_through_while_paused_generation_holds_every_pooled_connection(real):
    """Generation paused in place keeps its /generate calls open until the push's continue, and those calls can hold
    every connection of the client's generation pool (client-side interruption's second round doubles the calls in
    flight over ``concurrency``). The push's pause, update and continue must not wait for one of them: on one shared
    pool the push waited for a connection while the calls holding them waited for its continue, and a run hung. Here
    the pool's every connection carries a /generate call into a paused engine; the push still lands, the calls
    finish after its continue, answered under the new version."""
    url, ckpt_b = real
    with SGLangGenerator(url, timeout_s=120, concurrency=1) as gen:
        gen.generate([GenerationRequest([3, 12], SamplingParams(max_new_tokens=2))])  # compile before pausing
        n_conn = gen.generate_connections  # the generation pool's size
        assert httpx.post(url + "/pause_generation", json={"mode": "in_place"}).status_code == 200
        before = stats(url)["generate_requests"]
        body = generate_payload([4, 13, 5], SamplingParams(max_new_tokens=4))
        out: list = []
        calls = [threading.Thread(target=lambda: out.append(gen._http.post(url + "/generate", json=body)))
                 for _ in range(n_conn)]
        for t in calls:
            t.start()
        # every pooled connection now carries a call the paused engine holds
        wait_until(lambda: stats(url)["generate_requests"] - before >= n_conn, START_S, lambda: stats(url), 0.05)
        pushed: dict = {}
        push = threading.Thread(target=lambda: pushed.setdefault("r", gen.update_weights(str(ckpt_b), 8)))
        push.start()
        push.join(timeout=100)  # a hang guard: on one shared pool it waits out the client's 120 s pool timeout
        assert not push.is_alive() and "r" in pushed, "the push waited for a connection held by paused generation"
        for t in calls:
            t.join(timeout=START_S)
        assert gen.weight_version == 8 and len(out) == n_conn
    assert all(r.status_code == 200 for r in out)
    assert all(r.json()["meta_info"]["weight_version"] == "8" for r in out)
    assert [e["event"] for e in stats(url)["events"]][-3:] == [
        "pause_generation", "update_weights_from_disk", "continue_generation"]


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
    cfg = tiny()
    params = init_params(cfg, jax.random.PRNGKey(10))  # the server's --init-seed

    def lp_tol(tokens):
        return model_logprob_tol(cfg, cfg.max_seq_len, max_logit(params, cfg, tokens))

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
                # the same tokens through the same server, in batches of other compositions: two float32
                # orderings of the model (tests/tolerances.py)
                assert a.logprobs == pytest.approx(b.logprobs, rel=0, abs=lp_tol(prompt + b.token_ids))
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
    # paused once the request runs (it then runs for >= 1.5 s: 10 chunks of 150 ms), however long it took to arrive
    wait_until(lambda: stats(url)["running_rows"] >= 1, START_S, lambda: stats(url), 0.01)
    assert httpx.post(url + "/pause_generation", json={"mode": "abort"}).status_code == 200
    t.join()
    assert raw["r"].status_code == 200 and raw["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    httpx.post(url + "/continue_generation", json={})

    with SGLangGenerator(url, timeout_s=60, max_retries=10, backoff_s=0.1) as gen:
        th = threading.Thread(target=lambda: raw.setdefault("c", gen.generate([req])))
        th.start()
        wait_until(lambda: stats(url)["running_rows"] >= 1, START_S, lambda: stats(url), 0.01)  # as above
        httpx.post(url + "/pause_generation", json={"mode": "abort"})
        time.sleep(0.3)  # paused: the re-sent request waits (a slower machine only makes it wait longer)
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

    from scalerl_jax.rollout.client.wire import ServerCaps, parse_release

    caps = ServerCaps("http://x", version=sglang.__version__, release=parse_release(sglang.__version__))
    with SGLangGenerator("http://127.0.0.1:9") as gen:
        pause, upd = caps.update_bodies("/ckpt", 3, gen.pause_mode)
    ufields = {f.name for f in dataclasses.fields(UpdateWeightFromDiskReqInput)}
    assert set(upd) <= ufields, set(upd) - ufields
    UpdateWeightFromDiskReqInput(**upd)
    if pause:
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        PauseGenerationReqInput(**pause)


# ---- weight pushes: confirmed worker by worker; tokens tagged with the version their worker holds ----------------
# (after the tests above: a push here changes the real server's weights)


def _routes(fake) -> list[str]:
    return [path for path, _ in fake.control]


def test_a_push_that_does_not_take_is_pushed_again_and_confirmed(fakes):
    once = fakes(stuck_updates=1)  # the first update answers success but the worker still serves "default"
    ok = fakes()
    with SGLangGenerator([once.url, ok.url], timeout_s=10, version=0) as gen:
        gen.update_weights("/ckpt/v5", 5)
        assert gen.weight_version == 5 and gen.worker_versions() == {once.url: 5, ok.url: 5}
    push = ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    assert _routes(once) == push * 2 and _routes(ok) == push
    assert once.version == ok.version == "5"


def test_a_worker_stuck_on_another_version_is_named_in_the_error(fakes, tmp_path):
    stuck = fakes(stuck_updates=100, version="3")
    ok = fakes(version="3")
    with SGLangGenerator([stuck.url, ok.url], timeout_s=10, version=3) as gen:
        with pytest.raises(GenerationError) as err:
            gen.update_weights("/ckpt/v5", 5)
        msg = str(err.value)
        assert stuck.url in msg and "weight_version '5'" in msg and "reports weight_version '3'" in msg, msg
        assert ok.url not in msg
        # the push is not counted as done; each worker holds what it confirmed
        assert gen.weight_version == 3 and gen.worker_versions() == {stuck.url: 3, ok.url: 5}
    # pushed twice, and generation resumed after each
    assert _routes(stuck).count("/update_weights_from_disk") == 2 and _routes(stuck)[-1] == "/continue_generation"
    assert _routes(stuck).count("/pause_generation") == _routes(stuck).count("/continue_generation") == 2

    # through RemoteGenerator (what the trainer calls): one more try of the whole push, then the same error
    ckpt = tmp_path / "v6"
    ckpt.mkdir()
    with SGLangGenerator([stuck.url, ok.url], timeout_s=10, version=3) as gen:
        remote = RemoteGenerator(gen, tiny(), export_dir=tmp_path / "exports", tokenizer_dir=tmp_path,
                                 log=lambda s: None)
        with pytest.raises(GenerationError, match="weight_version '6'") as err2:
            remote.update_weights(str(ckpt), 6)
    e = err2.value.__cause__
    assert isinstance(e, WeightVersionMismatch) and (e.url, e.expected, e.found) == (stuck.url, "6", "3")
    assert _routes(stuck).count("/update_weights_from_disk") == 2 + 4


def test_a_release_without_versions_is_taken_at_its_word(fakes):
    """SGLang 0.4.10 reports no weight_version anywhere: the update response's success is all there is."""
    silent = fakes(version=None)
    with SGLangGenerator(silent.url, timeout_s=10) as gen:
        gen.update_weights("/ckpt/v2", 2)
        assert gen.worker_versions() == {silent.url: 2}
    assert _routes(silent).count("/update_weights_from_disk") == 1


# ---- a push that misses a worker (our real server, answering like SGLang 0.4.10: no versions) ---------------------


class CuttableProxy(ReleaseProxy):
    """A :class:`ReleaseProxy` (our real server showing itself as an SGLang release) that can stop listening
    (connections refused, as from a worker that is down) and listen again on the same port."""

    def down(self) -> None:
        self._handler = self.httpd.RequestHandlerClass
        self._port = self.httpd.server_address[1]
        self.httpd.shutdown()
        self.httpd.server_close()

    def up(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self._port), self._handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


def _served_by(prompts: list[list[int]], fake, proxy) -> list[str]:
    """Which of the two served each prompt ("fake" / "real"), from what each recorded."""
    at_fake = {tuple(b["input_ids"]) for b in fake.calls}
    at_real = {tuple(b["input_ids"]) for b in proxy.bodies.get("/generate", [])}
    out = []
    for p in prompts:
        assert (tuple(p) in at_fake) != (tuple(p) in at_real), p  # served once, by one of them
        out.append("fake" if tuple(p) in at_fake else "real")
    return out


def test_a_worker_that_missed_a_push_tags_its_old_version_or_is_caught_up(real, fakes):
    url, ckpt = real
    v0 = int(httpx.get(url + "/get_weight_version").json()["weight_version"])
    fake = fakes(version=str(v0))
    px = CuttableProxy(url, "0.4.10.post2")  # no weight_version, no spans, no output_token_versions
    try:
        with SGLangGenerator([fake.url, px.url], timeout_s=60, max_retries=0, concurrency=1, version=v0,
                             dead_cooldown_s=0.0, catch_up=False) as gen:
            px.down()
            gen.update_weights(str(ckpt), v0 + 3)  # reaches the fake only
            px.up()
            assert gen.weight_version == v0 + 3 and gen.worker_versions() == {fake.url: v0 + 3, px.url: v0}
            assert int(httpx.get(url + "/get_weight_version").json()["weight_version"]) == v0
            with gen._lock:  # a URL that is not a known worker (a router): the oldest version any worker holds
                assert gen.held_version("http://127.0.0.1:9") == v0

            prompts = [[3 + i, 12, 4 + i, 14] for i in range(4)]
            reqs = [GenerationRequest(p, SamplingParams(max_new_tokens=6), request_id=f"m{i}")
                    for i, p in enumerate(prompts)]
            results = gen.generate(reqs)
            who = _served_by(prompts, fake, px)
            assert sorted(who) == ["fake", "fake", "real", "real"]  # round-robin over both
            truth = iter(o["meta_info"]["output_token_versions"] for o in px.raw)  # what the server really used
            for w, (c,) in zip(who, results):
                if w == "real":
                    assert c.versions == next(truth) == [v0] * 6  # its old version, not the newest pushed
                else:  # the fake answers the prompt reversed, as SGLang 0.5.3 (weight_version: the pushed one)
                    assert c.token_ids == list(reversed(c.prompt_ids)) and c.versions == [v0 + 3] * 4

            # catching up: the worker gets the newest weights before it generates again
            gen.catch_up_workers = True
            fake.calls.clear()
            px.bodies.clear()
            px.raw.clear()
            results = gen.generate(reqs)
            assert gen.worker_versions() == {fake.url: v0 + 3, px.url: v0 + 3}
            assert [b["weight_version"] for b in px.bodies["/update_weights_from_disk"]] == [str(v0 + 3)]
            who = _served_by(prompts, fake, px)
            assert "real" in who
            truth = iter(o["meta_info"]["output_token_versions"] for o in px.raw)
            for w, (c,) in zip(who, results):
                if w == "real":
                    assert c.versions == next(truth) == [v0 + 3] * 6
    finally:
        px.close()
