"""A :class:`~scalerl_jax.rollout.protocol.Generator` over SGLang's native HTTP API.

``SGLangGenerator`` talks to one or more servers that speak SGLang's native API: real SGLang servers (0.4.10 to
0.5.23 read), our own :mod:`scalerl_jax.rollout.server`, or an ``sglang-router`` URL in front of either. It
sends one ``POST /generate`` per :class:`GenerationRequest` (``n`` samples in ``sampling_params.n``), many at
once from a thread pool, and maps each response into :class:`Completion` s. The wire format (request bodies,
the reading of responses from every release, server releases and capabilities) is
:mod:`scalerl_jax.rollout.client.wire`; here are the calls, the retries, the fleet and the weight updates.

Reliability: every request is a job that completes exactly once. A failed attempt (connection error, timeout,
HTTP 5xx, a malformed body, or an ``abort`` finish when ``retry_aborted``) is retried with exponential back-off
on the next live server; a server whose connection fails is marked dead for ``dead_cooldown_s``. HTTP 4xx is the
caller's fault and raises at once. A request aborted while a weight update is under way (SGLang before 0.5.6
aborts everything in flight on ``/pause_generation``) is re-sent without counting against ``max_retries``.

Weight updates (PipelineRL's in-flight update): :meth:`SGLangGenerator.update_weights` runs, on every server,
``/pause_generation`` -> ``/update_weights_from_disk {model_path, weight_version, flush_cache}`` ->
``/continue_generation``, in the bodies the server's release takes (:meth:`.ServerCaps.update_bodies`: 0.5.6+
and ours pause in ``pause_mode``, ``in_place`` by default; older releases abort what is in flight). A router
URL is expanded into its workers first (``GET /workers``, or older routers' ``GET /list_workers``):
``sglang-router`` does not forward these control routes. Each worker's version is then confirmed (re-pushed once,
else :class:`WeightVersionMismatch`); the client tags tokens with the version their worker really holds, and brings
a worker that missed a push up to date before the next ``generate`` (:mod:`scalerl_jax.rollout.client.weights`).

Interruption length control: our server does it in the engine (request field ``length_control``). Real SGLang does
not know that field and ``sglang-router`` drops every field it does not know, so the client does it itself there, in
two rounds of calls per request: generate up to the thinking budget; if thinking did not end, append the interruption
ids (flagged injected) and generate the answer from prompt + output (SGLang's prefix cache makes the second prefill
cheap). The engine path is used only for a server (not a router) whose ``GET /get_model_info`` lists
``length_control`` in ``scalerl_extensions``; a response that comes back without our ``think_budget`` field switches
that server to the client path and the request is redone there, so interruption never silently does not happen.
Both paths decide by the same rule and draw budgets the same way (:mod:`scalerl_jax.rollout.length_rule`).

Numbers for the trainer: :meth:`SGLangGenerator.stats_snapshot` (attempts, retries, failovers, re-sent aborted
requests, and per server: requests, generated tokens, busy seconds and tokens per busy second) and
:meth:`SGLangGenerator.device_count` (the fleet's accelerator devices, from each server's ``/get_server_info``).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Self

import httpx
import numpy as np

from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.client.weights import GenerationError, WeightUpdates, WeightVersionMismatch
from scalerl_jax.rollout.client.wire import (
    PAUSE_MODES,
    BadResponse,
    Sample,
    ServerCaps,
    generate_payload,
    parse_sample,
    response_outputs,
)
from scalerl_jax.rollout.length_rule import FINISH_NAMES, PH_ANSWER, PH_FREE, draw_budget, stop_finish, think_outcome
from scalerl_jax.rollout.protocol import INJECTED_VERSION, Completion, GenerationRequest, LengthControl

__all__ = ["GenerationError", "SGLangGenerator", "WeightVersionMismatch"]

log = logging.getLogger(__name__)


class _Retryable(Exception):
    """An attempt failed in a way that another attempt (maybe on another server) can fix."""


class _UpdateAborted(Exception):
    """The server aborted the request while a weight update was under way: re-send it, not counted as a retry."""


@dataclass
class _ServerStats:
    requests: int = 0
    tokens: int = 0
    errors: int = 0
    busy_s: float = 0.0
    in_flight: int = 0
    busy_since: float = 0.0


class SGLangGenerator(WeightUpdates):
    """Generator protocol over SGLang-API servers (see the module docstring).

    Args:
        urls: base URLs (``http://host:port``) of servers or of routers.
        timeout_s: per-HTTP-call timeout (a generation call must finish within it).
        max_retries: extra attempts per job after the first (re-sends of update-aborted requests not counted).
        backoff_s: first back-off; doubles per retry (capped at ``max_backoff_s``), with jitter.
        concurrency: jobs in flight at once (threads).
        length: default interruption length control for requests that carry none.
        server_length_control: True/False forces length control in the server / in the client; None asks each
            server (``/get_model_info``). Behind a router the client path is used whatever this says (the
            router would drop the field).
        retry_aborted: re-send a request whose server answered ``finish_reason`` abort (a retry). One aborted
            while an :meth:`update_weights` is under way is re-sent from scratch whatever this says, and not
            counted as a retry (its partial output is dropped).
        dead_cooldown_s: how long a server whose connection failed is skipped.
        version: weight version assumed before the first :meth:`update_weights`.
        pause_mode: ``/pause_generation`` mode of an update on servers that take one: ``in_place`` (keep KV
            caches, ``flush_cache: false``), ``retract`` (recompute them, flush) or ``abort``.
        max_abort_resends: most re-sends of one request aborted by weight updates.
        catch_up: before each :meth:`generate`, push the newest weights to workers that missed them
            (:meth:`catch_up`); False leaves them behind (their tokens keep the version they hold).
    """

    def __init__(
        self, urls: str | Sequence[str], *, timeout_s: float = 600.0, max_retries: int = 5, backoff_s: float = 0.5,
        concurrency: int = 64, length: LengthControl | None = None, server_length_control: bool | None = None,
        retry_aborted: bool = True, dead_cooldown_s: float = 5.0, max_backoff_s: float = 30.0, version: int = 0,
        seed: int = 0, pause_mode: str = "in_place", max_abort_resends: int = 100, catch_up: bool = True,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("SGLangGenerator: need at least one server URL")
        if max_retries < 0 or backoff_s < 0 or concurrency < 1 or timeout_s <= 0:
            raise ValueError("SGLangGenerator: need max_retries >= 0, backoff_s >= 0, concurrency >= 1, timeout_s > 0")
        if pause_mode not in PAUSE_MODES:
            raise ValueError(f"SGLangGenerator: pause_mode must be one of {PAUSE_MODES}, got {pause_mode!r}")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        # optional callable -> worker URLs for control calls (a LocalFleet's, which stay right while its router
        # restarts); None: ask the router
        self.control_urls = None
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.concurrency = int(concurrency)
        self.length = length
        self.server_length_control = server_length_control
        self.retry_aborted = retry_aborted
        self.dead_cooldown_s = float(dead_cooldown_s)
        self.pause_mode = pause_mode
        self.max_abort_resends = int(max_abort_resends)
        self._version = int(version)
        self._lock = threading.Lock()
        self._dead_until: dict[str, float] = {}
        self._extensions: dict[str, bool] = {}
        self._routers: dict[str, bool] = {}
        self._caps: dict[str, ServerCaps] = {}
        self._warned: set[str] = set()
        self._updating = 0  # update_weights calls under way
        self._update_epoch = 0  # bumped when one finishes
        self._rr = itertools.count()
        self._rng = np.random.default_rng(seed)
        timeout = httpx.Timeout(self.timeout_s, connect=min(5.0, self.timeout_s))
        # /generate calls: up to 2 x concurrency in flight (client-side interruption's second round has its own pool)
        self.generate_connections = 2 * self.concurrency + 8
        self._http = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=self.generate_connections))
        # control calls (pause, update, continue, versions, workers) on connections of their own: generation paused
        # in place holds its connections until the push's continue, which must never wait for one of them
        self._ctl_http = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=None))
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="sglang-client")
        self._pool2 = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="sglang-client-round2")
        self.stats: dict[str, int] = {
            "requests": 0, "attempts": 0, "retries": 0, "failovers": 0, "resent_aborted": 0,
            "client_interruptions": 0, "length_fallbacks": 0, "output_ids_mismatches": 0, "tokens": 0,
        }
        self._server_stats: dict[str, _ServerStats] = {}
        self._init_weights(catch_up)

    # ---- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel queued requests, close HTTP connections (requests in flight then fail at once) and stop the pool."""
        for pool in (self._pool, self._pool2):
            pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()
        self._ctl_http.close()
        for pool in (self._pool, self._pool2):
            pool.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def weight_version(self) -> int:
        """The newest version pushed (the last :meth:`update_weights`); per worker: :meth:`worker_versions`."""
        return self._version

    def reseed(self, seed: int) -> None:
        """Re-seed what the client draws itself (thinking budgets of client-side interruption)."""
        with self._lock:
            self._rng = np.random.default_rng(seed)

    # ---- stats ---------------------------------------------------------------------------------------

    def stats_snapshot(self) -> dict[str, Any]:
        """Cumulative counters, safe to log: a copy of :attr:`stats` plus ``servers``, per URL used for
        ``/generate`` (a router counts as one): ``requests`` (HTTP calls), ``tokens`` (output tokens returned,
        aborted partial outputs included), ``errors``, ``busy_s`` (wall seconds with at least one call in
        flight) and ``tokens_per_s`` (tokens / busy_s: the server's generation throughput while busy).

        Flat counters: ``requests`` (generate() requests), ``attempts`` (HTTP /generate calls), ``retries``,
        ``failovers`` (a retry moved to another server), ``resent_aborted`` (re-sends of requests aborted by a
        weight update; not retries), ``client_interruptions`` (samples interrupted by the client-side path),
        ``length_fallbacks`` (responses without our length-control fields, redone client-side),
        ``output_ids_mismatches`` (``output_ids`` that disagreed with the log-prob ids) and ``tokens``.
        """
        now = time.monotonic()
        with self._lock:
            out: dict[str, Any] = dict(self.stats)
            servers = {}
            for url, s in self._server_stats.items():
                busy = s.busy_s + (now - s.busy_since if s.in_flight else 0.0)
                servers[url] = {"requests": s.requests, "tokens": s.tokens, "errors": s.errors, "busy_s": busy,
                                "tokens_per_s": s.tokens / busy if busy > 0 else 0.0}
            out["servers"] = servers
        return out

    def _count(self, key: str, k: int = 1) -> None:
        with self._lock:
            self.stats[key] += k

    def _begin(self, url: str) -> None:
        with self._lock:
            s = self._server_stats.setdefault(url, _ServerStats())
            s.requests += 1
            if s.in_flight == 0:
                s.busy_since = time.monotonic()
            s.in_flight += 1

    def _end(self, url: str, tokens: int, error: bool) -> None:
        with self._lock:
            s = self._server_stats[url]
            s.in_flight -= 1
            if s.in_flight == 0:
                s.busy_s += time.monotonic() - s.busy_since
            s.tokens += tokens
            s.errors += int(error)
            self.stats["tokens"] += tokens

    # ---- server selection and discovery ---------------------------------------------------------------

    def _pick(self, avoid: str | None = None) -> str:
        """Next live server round-robin (skipping ``avoid`` when another is live); all dead -> least recently."""
        now = time.monotonic()
        with self._lock:
            live = [u for u in self.urls if self._dead_until.get(u, 0.0) <= now]
            if avoid is not None and len(live) > 1 and avoid in live:
                live.remove(avoid)
            if not live:
                return min(self.urls, key=lambda u: self._dead_until.get(u, 0.0))
            return live[next(self._rr) % len(live)]

    def _mark_dead(self, url: str) -> None:
        with self._lock:
            self._dead_until[url] = time.monotonic() + self.dead_cooldown_s

    def _get_json(self, url: str) -> Any:
        """GET ``url``; its JSON, or None for any status but 200 (raises httpx.HTTPError when unreachable)."""
        r = self._ctl_http.get(url, timeout=10.0)
        if r.status_code != 200:
            return None
        try:
            return r.json()
        except ValueError:
            return None

    def router_workers(self, url: str) -> list[str] | None:
        """The worker URLs behind router ``url`` (``GET /workers``, older ``GET /list_workers``); None when
        ``url`` is not a router. Raises httpx.HTTPError when it cannot be reached."""
        out = self._get_json(url + ws.ROUTER_WORKERS[0])
        if isinstance(out, dict) and isinstance(out.get("workers"), list):
            return [str(w["url"]).rstrip("/") for w in out["workers"] if isinstance(w, dict) and w.get("url")]
        out = self._get_json(url + ws.ROUTER_WORKERS[1])
        if isinstance(out, dict) and isinstance(out.get("urls"), list):
            return [str(u).rstrip("/") for u in out["urls"]]
        return None

    def _is_router(self, url: str) -> bool | None:
        """Cached router detection; None when ``url`` could not be asked (not cached)."""
        if url not in self._routers:
            try:
                self._routers[url] = self.router_workers(url) is not None
            except httpx.HTTPError:
                return None
        return self._routers[url]

    def server_caps(self, url: str, refresh: bool = False) -> ServerCaps:
        """What the server at ``url`` reports (``/server_info``, else ``/get_server_info``); cached. A server that
        cannot be asked gets unknown capabilities (assumed current), not cached."""
        if not refresh and url in self._caps:
            return self._caps[url]
        info: Any = None
        try:
            for route in (ws.SERVER_INFO_ALIAS, ws.SERVER_INFO):
                info = self._get_json(url + route)
                if isinstance(info, dict):
                    break
        except httpx.HTTPError:
            return ServerCaps(url)
        caps = ServerCaps.from_info(url, info)
        self._caps[url] = caps
        return caps

    def _server_does_length(self, url: str) -> bool:
        """Whether interruption goes to the server (our extension) rather than being done by the client."""
        router = self._is_router(url)
        if router is not False:  # a router drops length_control; unknown: the client path works everywhere
            if router and self.server_length_control and url not in self._warned:
                self._warned.add(url)
                log.warning("%s is a router, which drops length_control: interruption runs in the client", url)
            return False
        if self.server_length_control is not None:
            return self.server_length_control
        if url not in self._extensions:
            try:
                info = self._get_json(url + ws.MODEL_INFO)
                ok = isinstance(info, dict) and ws.LENGTH_CONTROL in (info.get(ws.EXTENSIONS_KEY) or [])
            except httpx.HTTPError:
                return False  # unknown yet: do it in the client this time, ask again next time
            self._extensions[url] = ok
        return self._extensions[url]

    # ---- one HTTP generate call with retries ------------------------------------------------------

    def _post_generate(self, url: str, body: dict[str, Any]) -> list[Sample]:
        """One attempt; returns the parsed samples or raises _Retryable / _UpdateAborted / GenerationError."""
        self._count("attempts")
        with self._lock:
            epoch, updating = self._update_epoch, self._updating
            v_submit = self.held_version(url)
        self._begin(url)
        tokens, failed = 0, True
        try:
            try:
                r = self._http.post(url + ws.GENERATE, json=body)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
                self._mark_dead(url)
                raise _Retryable(f"{url}: connection failed ({type(e).__name__}: {e})") from e
            except httpx.TimeoutException as e:
                raise _Retryable(f"{url}: timed out after {self.timeout_s}s") from e
            if r.status_code >= 500 or r.status_code in (408, 429):
                raise _Retryable(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
            if r.status_code >= 400:
                raise GenerationError(f"{url}: HTTP {r.status_code} for /generate: {r.text[:500]}")
            try:
                out = r.json()
            except ValueError as e:
                raise _Retryable(f"{url}: response is not JSON: {r.text[:200]!r}") from e
            try:
                outs = response_outputs(out, body["sampling_params"].get("n", 1))
                samples = []
                for o in outs:
                    samples.append(parse_sample(o, v_submit))
                    if samples[-1].output_ids_mismatch:
                        self._count("output_ids_mismatches")
            except BadResponse as e:
                raise _Retryable(f"{url}: {e}") from e
            tokens = sum(len(s.token_ids) for s in samples)
            if any(s.finish == "abort" for s in samples):
                fr = outs[0]["meta_info"].get("finish_reason")
                with self._lock:
                    during_update = updating or self._updating or self._update_epoch != epoch
                if during_update:
                    raise _UpdateAborted(f"{url}: aborted during a weight update ({fr})")
                if self.retry_aborted:
                    raise _Retryable(f"{url}: request aborted by the server ({fr})")
            failed = False
            return samples
        finally:
            self._end(url, tokens, failed)

    def _call(self, body: dict[str, Any], url: str | None = None) -> tuple[str, list[Sample]]:
        """``_post_generate`` with retries, back-off and failover; returns (server used, samples)."""
        url = url or self._pick()
        delay = self.backoff_s
        errors: list[str] = []
        attempt = resends = 0
        while True:
            try:
                return url, self._post_generate(url, body)
            except _UpdateAborted as e:
                resends += 1
                self._count("resent_aborted")
                if resends > self.max_abort_resends:
                    raise GenerationError(f"generate aborted by weight updates {resends} times: {e}") from e
                log.info("re-sending a request aborted by a weight update: %s", e)
                time.sleep(min(0.05 * resends, 1.0))  # the server is paused: it holds the re-sent request
            except _Retryable as e:
                errors.append(str(e))
                log.warning("generate attempt %d/%d failed: %s", attempt + 1, self.max_retries + 1, e)
                if attempt == self.max_retries:
                    break
                attempt += 1
                self._count("retries")
                time.sleep(delay * (1.0 + 0.1 * self._rng.random()))
                delay = min(delay * 2.0, self.max_backoff_s)
                new = self._pick(avoid=url)
                if new != url:
                    self._count("failovers")
                url = new
        raise GenerationError(f"generate failed after {self.max_retries + 1} attempts: " + " | ".join(errors[-3:]))

    # ---- Generator protocol --------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Blocking: ``n`` completions per request, in request order (each request completes exactly once).
        Workers that missed a weight push are brought up to date first (:meth:`catch_up`)."""
        self.catch_up()
        futures = [self._pool.submit(self._run_request, req, i) for i, req in enumerate(requests)]
        return [f.result() for f in futures]

    def _run_request(self, req: GenerationRequest, index: int) -> list[Completion]:
        self._count("requests")
        rid = req.request_id or f"req-{index}"
        lc = req.length or self.length
        t0 = time.time()
        url = self._pick()
        comps = None
        if lc is None or self._server_does_length(url):
            used, samples = self._call(generate_payload(req.prompt_ids, req.params, length=lc), url)
            if lc is not None and not all(s.has_extensions for s in samples):
                # something between us and the engine dropped length_control: redo it in the client
                log.warning("%s answered without length-control fields: interruption moves to the client", used)
                self._extensions[used] = False
                self._count("length_fallbacks")
            else:
                comps = [s.to_completion(rid, j, req) for j, s in enumerate(samples)]
        if comps is None:
            comps = self._client_interruption(rid, req, lc)
        t1 = time.time()
        for c in comps:
            c.timing.setdefault("submit", t0)
            c.timing["done"] = t1
        return comps

    def _client_interruption(self, rid: str, req: GenerationRequest, lc: LengthControl) -> list[Completion]:
        """Interruption length control done by the client (servers that do not support ``length_control``), with
        the engine's semantics and two rounds of calls per request instead of a chain per sample.

        Every sample draws its thinking budget B (as the engine does: :func:`.length_rule.draw_budget`). Round 1
        is one call for all ``n`` samples, up to the largest budget. A sample that stopped within its budget, or
        whose thinking ended (``think_end_ids`` completed) by then, keeps what it sampled; one whose thinking
        did not end by B is cut at B (tokens sampled past it are dropped: they do not change the distribution of
        what is kept) and gets the interruption ids (injected). Round 2 continues every unfinished sample from
        prompt + its tokens (+ the interruption), concurrently: the answer budget after an interruption, the
        rest of ``max_new_tokens`` otherwise."""
        p = req.params
        with self._lock:
            budgets = [draw_budget(self._rng, lc) for _ in range(p.n)]
        first = min(max(budgets), p.max_new_tokens)
        url, samples = self._call(generate_payload(req.prompt_ids, p, n=p.n, max_new_tokens=first))
        comps, todo = [], []  # todo: (completion, injected ids, tokens still allowed)
        for j, (s, budget) in enumerate(zip(samples, budgets)):
            c = s.to_completion(rid, j, req)
            c.think_budget = budget
            # the engine's state machine over what was sampled (length_rule.think_outcome)
            event, k = think_outcome(c.token_ids, c.finish_reason == "stop", lc.think_end_ids, budget,
                                     p.max_new_tokens)
            if event == "think_end":  # thinking ended in time: plain generation from here on
                if c.finish_reason == "length" and len(c.token_ids) < p.max_new_tokens:
                    todo.append((c, [], p.max_new_tokens - len(c.token_ids)))
            elif event in ("interrupt", "length"):  # the budget (or max_new_tokens) was reached while thinking
                c.token_ids, c.logprobs, c.versions, c.injected = (
                    c.token_ids[:k], c.logprobs[:k], c.versions[:k], c.injected[:k])
                if event == "interrupt":
                    todo.append((c, list(lc.interruption_ids), lc.answer_budget))
                    self._count("client_interruptions")
                else:
                    c.finish_reason = "length"
            # "stop": stopped while thinking; "open": the server ended the sample early (kept as it came)
            c.truncated = c.finish_reason == "length"  # round 2 decides again for the samples it continues
            comps.append(c)

        def finish(item) -> None:
            c, extra, more = item
            prompt2 = list(req.prompt_ids) + c.token_ids + extra
            _, samples2 = self._call(generate_payload(prompt2, p, n=1, max_new_tokens=more), url)
            c2 = samples2[0].to_completion(rid, c.sample_index, req)
            k = len(extra)
            c.token_ids += extra + c2.token_ids
            c.logprobs += [0.0] * k + c2.logprobs
            c.versions += [INJECTED_VERSION] * k + c2.versions
            c.injected += [True] * k + c2.injected
            # as in the engine: a stop while answering after an interruption is "interrupted"
            c.finish_reason = (FINISH_NAMES[int(stop_finish(np, PH_ANSWER if k else PH_FREE))]
                               if c2.finish_reason == "stop" else c2.finish_reason)
            c.truncated = c2.finish_reason == "length"

        if len(todo) == 1:
            finish(todo[0])
        elif todo:  # round 2 on its own pool: these calls must not wait for slots held by their own parents
            for f in [self._pool2.submit(finish, t) for t in todo]:
                f.result()
        return comps
