"""Two of our servers behind a real ``sglang-router`` (all real processes): spreading, and a worker killed mid-batch.

Every completion is checked against a teacher-forced pass of the model itself (greedy decoding), so a prompt
answered by the wrong request, or twice, or not at all would show.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import jax
import pytest
import sglang_router  # noqa: F401 -- a test dependency: missing, these tests fail instead of skipping

from scalerl_jax.models import init_params, tiny
from scalerl_jax.rollout.client import SGLangGenerator
from scalerl_jax.rollout.protocol import GenerationRequest, LengthControl, SamplingParams
from tests.servers import (
    START_S,
    assert_greedy_against_model,
    free_port,
    kill,
    kill_once_generating,
    prompts,
    save_random_checkpoint,
    start_server,
    wait_healthy,
)

INIT_SEED = 3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router")
    procs = []
    try:
        workers = []
        for i in range(2):
            proc, url = start_server(tmp, "--preset", "tiny", "--init-seed", str(INIT_SEED), "--max-batch", "8",
                                     "--decode-chunk", "4", "--debug-chunk-delay-ms", "25", name=f"worker{i}")
            procs.append(proc)
            workers.append((proc, url))
        for proc, url in workers:
            wait_healthy(url, proc)
        port = free_port()
        with open(tmp / "router.log", "w") as log:  # the child keeps its own copy of the descriptor
            router = subprocess.Popen(
                [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *[u for _, u in workers],
                 "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(port),
                 # its own metrics port: the default (29000) clashes with any other router on the machine
                 "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
                 "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                 "--retry-max-retries", "3", "--retry-initial-backoff-ms", "50", "--request-timeout-secs", "60",
                 "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy(), start_new_session=True,
            )
        router.log_path = tmp / "router.log"  # type: ignore[attr-defined]
        procs.append(router)
        rurl = f"http://127.0.0.1:{port}"
        wait_healthy(rurl, router)
        deadline = time.monotonic() + START_S  # a hang guard
        while time.monotonic() < deadline:  # the router registers workers asynchronously
            ws = httpx.get(rurl + "/workers", timeout=5).json().get("workers", [])
            if len(ws) == 2 and all(w.get("is_healthy") for w in ws):
                break
            time.sleep(0.2)
        yield rurl, workers, tmp
    finally:
        for p in procs:
            kill(p)


def _stats(url: str) -> dict:
    return httpx.get(url + "/stats", timeout=5).json()


def _check_results(reqs, results, params, cfg, version):
    assert len(results) == len(reqs)
    for req, comps in zip(reqs, results):
        assert len(comps) == 1 and comps[0].request_id == req.request_id
        c = comps[0]
        assert c.finish_reason in ("stop", "length") and c.versions == [version] * len(c.token_ids)
        assert_greedy_against_model(params, cfg, req.prompt_ids, c.token_ids, c.logprobs)


def test_interruption_happens_through_the_router(fleet):
    """The router drops our length_control field, so the client must interrupt by itself there, even when told
    the server can (server_length_control=True). A prompt whose thinking cannot end within its budget
    (think_end_ids longer than budget_hi) IS interrupted; both segments are the model's own greedy tokens."""
    rurl, workers, _ = fleet
    cfg = tiny()
    params = init_params(cfg, jax.random.PRNGKey(INIT_SEED))
    lc = LengthControl(think_end_ids=(16, 16, 16, 16), interruption_ids=(15, 16), budget_lo=2, budget_hi=3,
                       answer_budget=3)
    reqs = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=16), request_id=f"t{i}")
            for i, p in enumerate(prompts(3))]
    before = sum(_stats(u)["generate_requests"] for _, u in workers)
    with SGLangGenerator(rurl, timeout_s=60, length=lc, server_length_control=True, concurrency=3) as gen:
        results = gen.generate(reqs)
        stats = gen.stats_snapshot()
        assert gen.device_count() == 2  # the router expands into its two workers, one device each
    assert stats["client_interruptions"] == 3 and stats["length_fallbacks"] == 0
    assert sum(_stats(u)["generate_requests"] for _, u in workers) - before == 6  # two calls per sample
    for req, (c,) in zip(reqs, results):
        b = c.think_budget
        assert 2 <= b <= 3 and c.token_ids[b : b + 2] == [15, 16] and sum(c.injected) == 2
        assert c.injected[b : b + 2] == [True, True] and c.versions[b : b + 2] == [-1, -1]
        assert c.finish_reason in ("interrupted", "length") and len(c.token_ids) <= b + 2 + 3
        assert_greedy_against_model(params, cfg, req.prompt_ids, c.token_ids[:b], c.logprobs[:b])
        assert_greedy_against_model(params, cfg, req.prompt_ids + c.token_ids[: b + 2], c.token_ids[b + 2 :],
                                    c.logprobs[b + 2 :])


def test_router_spreads_then_survives_a_killed_worker(fleet):
    rurl, workers, tmp = fleet
    cfg = tiny()
    params = init_params(cfg, jax.random.PRNGKey(INIT_SEED))
    sp = SamplingParams(temperature=0.0, max_new_tokens=16)

    # 1) spreading: 8 requests through the router reach both workers, each exactly once
    reqs = [GenerationRequest(p, sp, request_id=f"a{i}") for i, p in enumerate(prompts(8))]
    with SGLangGenerator(rurl, timeout_s=60, max_retries=4, backoff_s=0.2, concurrency=4) as gen:
        before = [_stats(u)["generate_requests"] for _, u in workers]
        results = gen.generate(reqs)
        counts = [_stats(u)["generate_requests"] - b for (_, u), b in zip(workers, before)]
    assert min(counts) >= 1 and sum(counts) == len(reqs), counts
    _check_results(reqs, results, params, cfg, 0)

    # a weight update given the router URL reaches every worker (the router does not forward control routes;
    # the client expands the router into its workers). Same weights, new version tag.
    with SGLangGenerator(rurl, timeout_s=60) as gen:
        gen.update_weights(str(save_random_checkpoint(tmp / "same", INIT_SEED)), 3)
    assert [httpx.get(u + "/get_weight_version").json()["weight_version"] for _, u in workers] == ["3", "3"]

    # 2) kill worker 1 while it is generating; every prompt still completes exactly once
    reqs = [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=24), request_id=f"b{i}")
            for i, p in enumerate(prompts(24))]
    victim_proc, victim_url = workers[1]
    start = _stats(victim_url)["generate_requests"]

    # mid-generation: each batch takes several 25 ms chunks
    killer = kill_once_generating(victim_url, lambda: kill(victim_proc), start)

    t = threading.Thread(target=killer)
    with SGLangGenerator(rurl, timeout_s=60, max_retries=8, backoff_s=0.2, concurrency=8) as gen:
        t.start()
        results = gen.generate(reqs)
        t.join()
        client_stats = dict(gen.stats)
    assert victim_proc.poll() is not None
    _check_results(reqs, results, params, cfg, 3)
    survivor = _stats(workers[0][1])
    assert survivor["generate_requests"] > 0
    # the client's own accounting of this call: one request each, every attempt either succeeded (one per request)
    # or was retried/re-sent, the tokens are exactly the tokens returned, nothing needed a fallback
    n_tokens = sum(len(c.token_ids) for comps in results for c in comps)
    assert client_stats["requests"] == len(reqs) and client_stats["tokens"] == n_tokens, client_stats
    assert client_stats["attempts"] == len(reqs) + client_stats["retries"] + client_stats["resent_aborted"]
    assert client_stats["output_ids_mismatches"] == 0 and client_stats["length_fallbacks"] == 0
    # one router URL: there is nowhere to fail over to on the client side (the router itself re-routes)
    assert client_stats["failovers"] == 0
