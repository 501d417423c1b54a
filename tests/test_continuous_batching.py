"""Continuous batching in the JaxEngine and its SGLang-API server, checked against independent references.

Rows admitted while others run must decode exactly as a teacher-forced full forward of the model says (greedy
tokens are its argmax, log-probs its log-softmax); across an in-flight weight swap a hand-built mixed-version
KV-cache reference (old params fill the cache before the swap, new params after it) is the reference. The
scheduler's own counters show that admission really happened mid-batch.
"""

from __future__ import annotations

import threading
import time

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.models import init_params, tiny
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.protocol import GenerationRequest, LengthControl, SamplingParams
from tests.engine_refs import PAD_T, mixed_cache_logp, np_params
from tests.servers import assert_greedy_against_model, forward_jit, kill, start_server, stats, wait_healthy, wait_until
from tests.tolerances import max_logit, model_logprob_tol


def _greedy(prompt, max_new, rid=""):
    return GenerationRequest(list(prompt), SamplingParams(temperature=0.0, max_new_tokens=max_new), request_id=rid)


def _model_logp(params, cfg, prompt, out_ids, temperature=1.0):
    """log_softmax(logits / T) of a teacher-forced full forward over prompt + output, at the output positions."""
    seq = list(prompt) + list(out_ids)
    toks = np.zeros((1, cfg.max_seq_len), np.int32)
    toks[0, : len(seq)] = seq
    logits = np.asarray(forward_jit(jax.tree.map(jnp.asarray, params), jnp.asarray(toks), cfg))[0]
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits) / temperature, axis=-1))
    return logp[len(prompt) - 1: len(prompt) - 1 + len(out_ids)]


@pytest.fixture(scope="module")
def model():
    cfg = tiny()
    return cfg, init_params(cfg, jax.random.PRNGKey(4))


def test_short_request_joins_running_batch_and_finishes_first(model):
    """A second caller's request, submitted while the first runs, joins at a chunk boundary and finishes first."""
    cfg, params = model
    eng = JaxEngine(cfg, params, max_batch=8, max_len=32, decode_chunk=4)
    long_req, short_req = _greedy([3, 12, 4, 13, 5, 14], 24, "long"), _greedy([7, 13, 9, 14], 4, "short")
    other: dict = {}

    def hook(ci):
        if ci == 1:  # two chunks into the long request: a second thread asks for the short one
            t = threading.Thread(target=lambda: other.setdefault("out", eng.generate([short_req])))
            t.start()
            other["thread"] = t
            while eng.counters()["waiting_rows"] == 0:
                time.sleep(0.001)

    eng.chunk_hook = hook
    (long_c,), = eng.generate([long_req])
    other["thread"].join()
    (short_c,), = other["out"]
    c = eng.counters()
    assert c["admitted_rows"] == 2 and c["admitted_mid_batch"] == 1 and c["max_running_rows"] == 2
    assert c["busy_periods"] == 1 and c["running_rows"] == 0 and c["batch_slots"] == 0  # reset once idle
    assert len(short_c.token_ids) == 4 and len(long_c.token_ids) == 24
    assert short_c.timing["done"] < long_c.timing["done"]
    assert short_c.timing["start"] > long_c.timing["start"]
    for req, comp in ((long_req, long_c), (short_req, short_c)):
        assert comp.request_id == req.request_id and comp.versions == [0] * len(comp.token_ids)
        assert_greedy_against_model(params, cfg, req.prompt_ids, comp.token_ids, comp.logprobs)


def test_rows_admitted_mid_flight_match_the_model(model):
    """One row starts alone (8 slots, 32 positions); 20 more rows arrive after its first chunk, among them one that
    needs 64 positions and sampled ones: the slots grow to 16 and the cache to 64 positions, 5 rows wait for free
    slots, and every row still matches the teacher-forced model."""
    cfg, params = model
    eng = JaxEngine(cfg, params, max_batch=16, max_len=64, decode_chunk=4, seed=3)
    rng = np.random.default_rng(0)
    first = _greedy([2, 12, 3, 14], 20, "first")
    later = [_greedy(rng.integers(2, 17, size=int(rng.integers(2, 10))).tolist(), int(rng.integers(3, 16)), f"g{i}")
             for i in range(16)]
    later.append(_greedy([5, 12, 6, 13, 7, 14, 8, 12, 9], 40, "long"))  # 49 positions: the cache must grow
    sampled = GenerationRequest([4, 13, 4, 14], SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=12, n=3),
                                request_id="sampled")
    later.append(sampled)
    subs = []
    eng.chunk_hook = lambda ci: subs.append(eng.submit(later)) if ci == 0 else None
    (first_c,), = eng.generate([first])
    results = eng.drive(subs[0])  # the rest of the rows still run when `first` is done
    c = eng.counters()
    assert c["admitted_rows"] == 1 + 16 + 1 + 3 and c["admitted_mid_batch"] == 20
    assert c["max_running_rows"] == 16  # max_batch: the rest waited for free slots
    assert_greedy_against_model(params, cfg, first.prompt_ids, first_c.token_ids, first_c.logprobs)
    for req, comps in zip(later, results):
        assert len(comps) == req.params.n and [x.sample_index for x in comps] == list(range(req.params.n))
        for comp in comps:
            assert comp.request_id == req.request_id and comp.finish_reason == "length"
            assert len(comp.token_ids) == req.params.max_new_tokens
            if req is sampled:
                ref = _model_logp(params, cfg, req.prompt_ids, comp.token_ids, temperature=0.8)
                got = np.asarray(comp.logprobs)
                # two float32 orderings of the model (tests/tolerances.py)
                tol = model_logprob_tol(cfg, PAD_T, max_logit(params, cfg, req.prompt_ids + comp.token_ids) / 0.8)
                np.testing.assert_allclose(got, ref[np.arange(len(got)), comp.token_ids], atol=tol, rtol=0)
            else:
                assert_greedy_against_model(params, cfg, req.prompt_ids, comp.token_ids, comp.logprobs)
    assert len({tuple(x.token_ids) for x in results[-1]}) > 1  # the 3 samples differ


def test_weight_swap_with_rows_mid_flight_and_admitted_after(model):
    """Row A runs from the start, row B joins after chunk 0, the weights change after chunk 1 and row C joins
    then: A has 2 chunks of old tokens, B one, C none; every token is the argmax of the params of its version
    over the KV cache the engine really had (old params fill it before the swap, new ones after)."""
    cfg, _ = model
    old, new = np_params(cfg, 0), np_params(cfg, 1)
    C = 4
    eng = JaxEngine(cfg, old, max_batch=8, max_len=PAD_T, decode_chunk=C, version=3)
    reqs = {"A": _greedy([2, 3, 12, 4, 14], 14, "A"), "B": _greedy([9, 9, 13], 14, "B"),
            "C": _greedy([5, 13, 6, 6, 14], 12, "C")}
    subs = {}

    def hook(ci):
        if ci == 0:
            subs["B"] = eng.submit([reqs["B"]])
        elif ci == 1:
            eng.update_weights(new, 7)
            subs["C"] = eng.submit([reqs["C"]])

    eng.chunk_hook = hook
    (a,), = eng.generate([reqs["A"]])
    (b,), = eng.drive(subs["B"])
    (c,), = eng.drive(subs["C"])
    assert eng.weight_version == 7 and eng.counters()["admitted_mid_batch"] == 2
    assert c.versions == [7] * 12
    assert_greedy_against_model(new, cfg, reqs["C"].prompt_ids, c.token_ids, c.logprobs)
    for comp, m in ((a, 2 * C), (b, C)):  # m tokens drawn from the old params
        req = reqs[comp.request_id]
        n_new, P = len(comp.token_ids), len(req.prompt_ids)
        assert comp.versions == [3] * m + [7] * (n_new - m)
        tokens = np.zeros(2 * PAD_T, np.int32)
        tokens[: P + n_new] = req.prompt_ids + comp.token_ids
        cut = P - 1 + m  # positions < cut were fed through the old params
        logp_old, logp_new = mixed_cache_logp(old, new, jnp.asarray(tokens), cut, 1.0, cfg=cfg, new_len=16)
        ref = np.concatenate([np.asarray(logp_old)[P - 1: cut], np.asarray(logp_new)[: n_new - m]])
        tok = np.asarray(comp.token_ids)
        # two float32 orderings of the model (tests/tolerances.py)
        tol = max(model_logprob_tol(cfg, PAD_T, max_logit(w, cfg, req.prompt_ids + comp.token_ids)) for w in (old, new))
        assert (ref[np.arange(n_new), tok] >= ref.max(axis=1) - tol).all(), comp.request_id
        np.testing.assert_allclose(comp.logprobs, ref[np.arange(n_new), tok], atol=tol, rtol=0)
        # the mixed cache matters: the new params over a cache of their own would predict other log-probs, further
        # off than rounding could move them
        pure_new = _model_logp(new, cfg, req.prompt_ids, comp.token_ids)[np.arange(n_new), tok]
        assert np.abs(pure_new[m:] - np.asarray(comp.logprobs)[m:]).max() > 2 * tol


def test_same_submissions_same_seed_same_outputs(model):
    """Run to run determinism (PPO-off-policy resume relies on it); reseed() restarts the streams."""
    cfg, params = model
    lc = LengthControl(think_end_ids=(16,), interruption_ids=(15, 16), budget_lo=2, budget_hi=9, answer_budget=4)
    reqs = [GenerationRequest([3 + i, 12, 4, 14], SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=20,
                                                                 n=4), length=lc if i % 2 else None)
            for i in range(3)]

    def run(eng):
        return [[(x.token_ids, x.logprobs, x.think_budget) for x in cs] for cs in eng.generate(reqs)]

    e1 = JaxEngine(cfg, params, max_batch=16, max_len=32, decode_chunk=4, seed=11)
    e2 = JaxEngine(cfg, params, max_batch=16, max_len=32, decode_chunk=4, seed=11)
    first = run(e1)
    assert run(e2) == first
    assert run(e1) != first  # the streams moved on
    e1.reseed(11)
    assert run(e1) == first
    e2._rng, e2._key = np.random.default_rng(11), jax.random.PRNGKey(11)  # the trainer's fallback still works
    assert run(e2) == first


def test_failures_finish_every_submission_and_the_engine_recovers(model):
    cfg, params = model
    eng = JaxEngine(cfg, params, max_batch=8, max_len=32, decode_chunk=4)
    req, other_req = _greedy([3, 12, 4, 14], 12, "r"), _greedy([5, 13, 5, 14], 12, "o")

    def hook(ci):
        if ci == 1:
            raise RuntimeError("hook")

    # an exception from chunk_hook aborts every submission (partial outputs kept) and reaches the caller
    other = eng.submit([other_req])
    eng.chunk_hook = hook
    with pytest.raises(RuntimeError, match="hook"):
        eng.generate([req])
    (c,), = other.wait(0)
    assert c.finish_reason == "abort" and len(c.token_ids) == 8 and c.versions == [0] * 8
    assert_greedy_against_model(params, cfg, other_req.prompt_ids, c.token_ids, c.logprobs)
    eng.chunk_hook = None

    # a failing decode fails every submission in the engine with the error
    decode = eng._decode_fn

    def broken(*a, **k):
        raise RuntimeError("boom")

    eng._decode_fn = broken
    other = eng.submit([other_req])
    with pytest.raises(RuntimeError, match="boom"):
        eng.generate([req])
    with pytest.raises(RuntimeError, match="boom"):
        other.wait(0)
    assert not eng.has_work() and eng.counters()["running_rows"] == 0
    eng._decode_fn = decode
    (c,), = eng.generate([req])  # and the engine still works
    assert c.finish_reason == "length" and len(c.token_ids) == 12
    assert_greedy_against_model(params, cfg, req.prompt_ids, c.token_ids, c.logprobs)


# ---- the server --------------------------------------------------------------------------------------------

INIT_SEED = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # 150 ms per 4-token chunk: a 40-token request runs for at least 1.5 s, so that a second request (or a pause)
    # sent once it runs lands while it still runs, with a second of room for a loaded machine's HTTP round trip
    proc, url = start_server(tmp_path_factory.mktemp("cb"), "--preset", "tiny", "--init-seed", str(INIT_SEED),
                             "--max-batch", "8", "--max-len", "64", "--decode-chunk", "4",
                             "--debug-chunk-delay-ms", "150")
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        kill(proc)


def _post(url, body, out, key):
    out[key] = httpx.post(url + "/generate", json=body, timeout=120.0)


def _wait_running(url, rows=1, timeout_s=60.0):
    def running():
        s = stats(url)
        return s if s["running_rows"] >= rows and s["decode_chunks"] >= 1 else None

    return wait_until(running, timeout_s, lambda: stats(url), 0.01)


def _body(prompt, max_new):
    # ignore_eos: every request runs to max_new_tokens, whatever the random model emits
    return {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True},
            "return_logprob": True}


def _check(params, cfg, prompt, out):
    meta = out["meta_info"]
    assert_greedy_against_model(params, cfg, prompt, out["output_ids"], [t[0] for t in meta["output_token_logprobs"]])
    assert meta["output_token_versions"] == [0] * len(out["output_ids"])


def test_server_second_request_joins_running_batch(server):
    cfg = tiny()
    params = init_params(cfg, jax.random.PRNGKey(INIT_SEED))
    p1, p2 = [3, 12, 4, 13, 5, 14], [8, 13, 2, 14]
    before = httpx.get(server + "/stats").json()
    res: dict = {}
    t1 = threading.Thread(target=_post, args=(server, _body(p1, 40), res, "long"))
    t1.start()
    _wait_running(server)
    out2 = httpx.post(server + "/generate", json=_body(p2, 4), timeout=120.0)
    assert t1.is_alive()  # the short one came back while the long one still runs
    t1.join()
    deadline = time.monotonic() + 120  # a hang guard
    while (after := httpx.get(server + "/stats").json())["busy_periods"] == before["busy_periods"]:
        assert time.monotonic() < deadline  # the busy period ends just after the last answer went out
        time.sleep(0.01)
    assert after["admitted_mid_batch"] - before["admitted_mid_batch"] == 1 and after["max_running_rows"] >= 2
    assert after["busy_periods"] - before["busy_periods"] == 1  # one run of the scheduler served both
    assert after["engine_batches"] - before["engine_batches"] == 2
    assert res["long"].status_code == 200 and out2.status_code == 200
    long_out, short_out = res["long"].json(), out2.json()
    assert len(long_out["output_ids"]) == 40 and len(short_out["output_ids"]) == 4
    _check(params, cfg, p1, long_out)
    _check(params, cfg, p2, short_out)


def test_server_pause_abort_returns_partial_tokens(server):
    cfg = tiny()
    params = init_params(cfg, jax.random.PRNGKey(INIT_SEED))
    prompt = [6, 12, 7, 14]
    res: dict = {}
    t = threading.Thread(target=_post, args=(server, _body(prompt, 40), res, "r"))
    t.start()
    s = _wait_running(server)
    while httpx.get(server + "/stats").json()["decode_chunks"] < s["decode_chunks"] + 2:
        time.sleep(0.01)
    r = httpx.post(server + "/pause_generation", json={"mode": "abort"}, timeout=30.0)
    assert r.status_code == 200 and r.json()["num_paused_requests"] == 1
    t.join(timeout=30)
    out = res["r"].json()
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["scalerl_finish_reason"] == "abort"
    n = len(out["output_ids"])
    assert 8 <= n < 40 and out["meta_info"]["completion_tokens"] == n  # the partial output survives
    _check(params, cfg, prompt, out)
    # paused: a new request waits; after continue it runs to the end
    t = threading.Thread(target=_post, args=(server, _body(prompt, 12), res, "after"))
    t.start()
    time.sleep(0.3)
    assert t.is_alive() and httpx.get(server + "/stats").json()["running_rows"] == 0
    httpx.post(server + "/continue_generation", json={})
    t.join(timeout=60)
    out = res["after"].json()
    m = min(n, 12)
    assert out["output_ids"][:m] == res["r"].json()["output_ids"][:m]  # greedy: the prefix it had before the abort
    _check(params, cfg, prompt, out)
