"""A :class:`~scalerl_jax.rollout.protocol.Generator` over SGLang's native HTTP API.

``SGLangGenerator`` talks to one or more servers that speak SGLang's native API: real SGLang servers, our
own :mod:`scalerl_jax.rollout.server`, or one ``sglang-router`` URL in front of either. It sends one
``POST /generate`` per :class:`GenerationRequest` (``n`` samples in ``sampling_params.n``), many at once
from a thread pool, and maps each response into :class:`Completion` s.

Reliability: every request is a job that completes exactly once. A failed attempt (connection error,
timeout, HTTP 5xx, a malformed body, or an ``abort`` finish when ``retry_aborted``) is retried with
exponential back-off on the next live server; a server whose connection fails is marked dead for
``dead_cooldown_s`` so that its in-flight and future jobs go to the others. Jobs never run twice at once,
so nothing is duplicated. HTTP 4xx is the caller's fault and raises at once.

Weight updates (PipelineRL's in-flight update): :meth:`SGLangGenerator.update_weights` runs, on every
server, ``/pause_generation {"mode": "in_place"}`` -> ``/update_weights_from_disk {model_path,
weight_version, flush_cache: false}`` -> ``/continue_generation``. A router URL is expanded into its
workers first (``GET /workers``; ``sglang-router`` does not forward these control routes).

Interruption length control: our server does it in the engine (request field ``length_control``, see
:mod:`scalerl_jax.rollout.server`). A plain SGLang server does not know that field, so the client does it
itself in two calls per sample: generate up to the thinking budget; if thinking did not end, append the
interruption ids (flagged injected) and generate the answer from prompt + output (SGLang's prefix cache
makes the second prefill cheap). Which path is used is decided per server from ``GET /get_model_info``
(``"scalerl_extensions"``) unless ``server_length_control`` forces it.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from scalerl_jax.rollout.protocol import (
    INJECTED_VERSION,
    Completion,
    GenerationRequest,
    LengthControl,
    SamplingParams,
)

log = logging.getLogger(__name__)

_SGLANG_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class GenerationError(RuntimeError):
    """A request that could not be completed (bad request, or every retry failed)."""


class _Retryable(Exception):
    """An attempt failed in a way that another attempt (maybe on another server) can fix."""


def parse_version(v: Any, default: int) -> int:
    """SGLang's ``weight_version`` is a string (``"default"`` until set); ours are integers."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def sampling_payload(p: SamplingParams, n: int | None = None, max_new_tokens: int | None = None) -> dict[str, Any]:
    """SGLang ``sampling_params`` for ``p`` (field names as in SGLang's SamplingParams)."""
    out: dict[str, Any] = {
        "temperature": float(p.temperature), "top_p": float(p.top_p),
        "max_new_tokens": int(p.max_new_tokens if max_new_tokens is None else max_new_tokens),
        "n": int(p.n if n is None else n),
    }
    if p.stop_token_ids:
        out["stop_token_ids"] = [int(t) for t in p.stop_token_ids]
    return out


def length_payload(lc: LengthControl) -> dict[str, Any]:
    """Our extension field ``length_control`` (ignored by, and unknown to, real SGLang)."""
    return {
        "think_end_ids": list(lc.think_end_ids), "interruption_ids": list(lc.interruption_ids),
        "budget_lo": lc.budget_lo, "budget_hi": lc.budget_hi, "answer_budget": lc.answer_budget,
    }


def generate_payload(prompt_ids: Sequence[int], p: SamplingParams, *, n: int | None = None,
                     max_new_tokens: int | None = None, length: LengthControl | None = None) -> dict[str, Any]:
    """The ``POST /generate`` body for one prompt (SGLang's GenerateReqInput field names)."""
    body: dict[str, Any] = {
        "input_ids": [int(t) for t in prompt_ids],
        "sampling_params": sampling_payload(p, n, max_new_tokens),
        "return_logprob": True,
        "stream": False,
    }
    if length is not None:
        body["length_control"] = length_payload(length)
    return body


def _contains(seq: Sequence[int], sub: Sequence[int]) -> bool:
    m = len(sub)
    return m > 0 and any(list(seq[i : i + m]) == list(sub) for i in range(len(seq) - m + 1))


class SGLangGenerator:
    """Generator protocol over SGLang-API servers (see the module docstring).

    Args:
        urls: base URLs (``http://host:port``) of servers or of one router.
        timeout_s: per-HTTP-call timeout (a generation call must finish within it).
        max_retries: extra attempts per job after the first.
        backoff_s: first back-off; doubles per retry (capped at ``max_backoff_s``), with jitter.
        concurrency: jobs in flight at once (threads).
        length: default interruption length control for requests that carry none.
        server_length_control: True/False forces length control in the server / in the client; None asks
            each server (``/get_model_info``).
        retry_aborted: re-send a request whose server answered ``finish_reason`` abort.
        dead_cooldown_s: how long a server whose connection failed is skipped.
        version: weight version assumed before the first :meth:`update_weights`.
    """

    def __init__(
        self, urls: str | Sequence[str], *, timeout_s: float = 600.0, max_retries: int = 5, backoff_s: float = 0.5,
        concurrency: int = 64, length: LengthControl | None = None, server_length_control: bool | None = None,
        retry_aborted: bool = True, dead_cooldown_s: float = 5.0, max_backoff_s: float = 30.0, version: int = 0,
        seed: int = 0,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("SGLangGenerator: need at least one server URL")
        if max_retries < 0 or backoff_s < 0 or concurrency < 1 or timeout_s <= 0:
            raise ValueError("SGLangGenerator: need max_retries >= 0, backoff_s >= 0, concurrency >= 1, timeout_s > 0")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.concurrency = int(concurrency)
        self.length = length
        self.server_length_control = server_length_control
        self.retry_aborted = retry_aborted
        self.dead_cooldown_s = float(dead_cooldown_s)
        self._version = int(version)
        self._lock = threading.Lock()
        self._dead_until: dict[str, float] = {}
        self._extensions: dict[str, bool] = {}
        self._rr = itertools.count()
        self._rng = random.Random(seed)
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout_s, connect=min(5.0, self.timeout_s)),
                                  limits=httpx.Limits(max_connections=self.concurrency + 8))
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="sglang-client")
        self.stats = {"attempts": 0, "retries": 0, "failovers": 0}

    # ---- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the thread pool and close HTTP connections."""
        self._pool.shutdown(wait=True)
        self._http.close()

    def __enter__(self) -> SGLangGenerator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def weight_version(self) -> int:
        return self._version

    # ---- server selection --------------------------------------------------------------------------

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

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def _mark_dead(self, url: str) -> None:
        with self._lock:
            self._dead_until[url] = time.monotonic() + self.dead_cooldown_s

    def _server_does_length(self, url: str) -> bool:
        if self.server_length_control is not None:
            return self.server_length_control
        if url not in self._extensions:
            try:
                r = self._http.get(f"{url}/get_model_info", timeout=10.0)
                ok = r.status_code == 200 and "length_control" in (r.json().get("scalerl_extensions") or [])
            except (httpx.HTTPError, ValueError, AttributeError):
                return False  # unknown yet: do it in the client this time, ask again next time
            self._extensions[url] = ok
        return self._extensions[url]

    # ---- one HTTP generate call with retries ------------------------------------------------------

    def _post_generate(self, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """One attempt; returns the list of per-sample outputs or raises _Retryable / GenerationError."""
        self._count("attempts")
        try:
            r = self._http.post(f"{url}/generate", json=body)
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
        outs = out if isinstance(out, list) else [out]
        n = body["sampling_params"].get("n", 1)
        if len(outs) != n or not all(isinstance(o, dict) and "meta_info" in o for o in outs):
            raise _Retryable(f"{url}: expected {n} outputs with meta_info, got {str(out)[:200]}")
        if self.retry_aborted and any(_finish_type(o) == "abort" for o in outs):
            raise _Retryable(f"{url}: request aborted by the server ({outs[0]['meta_info'].get('finish_reason')})")
        return outs

    def _call(self, body: dict[str, Any], url: str | None = None) -> tuple[str, list[dict[str, Any]]]:
        """``_post_generate`` with retries, back-off and failover; returns (server used, outputs)."""
        url = url or self._pick()
        delay = self.backoff_s
        errors = []
        for attempt in range(self.max_retries + 1):
            try:
                return url, self._post_generate(url, body)
            except _Retryable as e:
                errors.append(str(e))
                log.warning("generate attempt %d/%d failed: %s", attempt + 1, self.max_retries + 1, e)
                if attempt == self.max_retries:
                    break
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
        """Blocking: ``n`` completions per request, in request order (each request completes exactly once)."""
        futures = [self._pool.submit(self._run_request, req, i) for i, req in enumerate(requests)]
        return [f.result() for f in futures]

    def _run_request(self, req: GenerationRequest, index: int) -> list[Completion]:
        rid = req.request_id or f"req-{index}"
        lc = req.length or self.length
        t0 = time.time()
        url = self._pick()
        if lc is None or self._server_does_length(url):
            body = generate_payload(req.prompt_ids, req.params, length=lc)
            _, outs = self._call(body, url)
            comps = [self._to_completion(rid, j, req, o) for j, o in enumerate(outs)]
        else:
            comps = [self._client_interruption(rid, j, req, lc) for j in range(req.params.n)]
        t1 = time.time()
        for c in comps:
            c.timing.setdefault("submit", t0)
            c.timing["done"] = t1
        return comps

    def _to_completion(self, rid: str, j: int, req: GenerationRequest, o: dict[str, Any]) -> Completion:
        meta = o["meta_info"]
        ids = [int(t) for t in o.get("output_ids", [])]
        lps = meta.get("output_token_logprobs") or []
        if len(lps) != len(ids):
            raise GenerationError(f"{rid}: {len(ids)} output ids but {len(lps)} output_token_logprobs")
        logprobs = [float(t[0]) if t[0] is not None else 0.0 for t in lps]
        if any(int(t[1]) != i for t, i in zip(lps, ids)):
            raise GenerationError(f"{rid}: output_token_logprobs token ids differ from output_ids")
        server_version = parse_version(meta.get("weight_version"), self._version)
        versions = [int(v) for v in meta.get("output_token_versions") or [server_version] * len(ids)]
        injected = [bool(b) for b in meta.get("output_token_injected") or [False] * len(ids)]
        finish = meta.get("scalerl_finish_reason") or _SGLANG_FINISH.get(_finish_type(o) or "", "stop")
        truncated = bool(meta.get("truncated", finish == "length"))
        return Completion(
            request_id=rid, sample_index=j, prompt_ids=list(req.prompt_ids), token_ids=ids, logprobs=logprobs,
            versions=versions, injected=injected, finish_reason=finish, truncated=truncated,
            think_budget=meta.get("think_budget"), meta=dict(req.meta),
        )

    def _client_interruption(self, rid: str, j: int, req: GenerationRequest, lc: LengthControl) -> Completion:
        """Interruption length control done by the client (servers that do not support ``length_control``)."""
        p = req.params
        budget = self._rng.randint(lc.budget_lo, lc.budget_hi)
        first = min(budget, p.max_new_tokens)
        url, outs = self._call(generate_payload(req.prompt_ids, p, n=1, max_new_tokens=first))
        c = self._to_completion(rid, j, req, outs[0])
        c.think_budget = budget
        if c.finish_reason != "length" or len(c.token_ids) >= p.max_new_tokens:
            c.truncated = c.finish_reason == "length"
            return c
        if _contains(c.token_ids, lc.think_end_ids):  # thinking ended in time: just let it finish its answer
            extra_ids: list[int] = []
            more = p.max_new_tokens - len(c.token_ids)
        else:
            extra_ids = list(lc.interruption_ids)
            more = lc.answer_budget
        prompt2 = list(req.prompt_ids) + c.token_ids + extra_ids
        _, outs2 = self._call(generate_payload(prompt2, p, n=1, max_new_tokens=more), url)
        c2 = self._to_completion(rid, j, req, outs2[0])
        k = len(extra_ids)
        c.token_ids += extra_ids + c2.token_ids
        c.logprobs += [0.0] * k + c2.logprobs
        c.versions += [INJECTED_VERSION] * k + c2.versions
        c.injected += [True] * k + c2.injected
        # like the engine: a stop while answering after an interruption is "interrupted"
        c.finish_reason = "interrupted" if (k and c2.finish_reason == "stop") else c2.finish_reason
        c.truncated = c2.finish_reason == "length"
        return c

    # ---- weights ---------------------------------------------------------------------------------------

    def _control_targets(self) -> list[str]:
        """Server URLs to send control calls to: a router URL expands into its workers."""
        targets: list[str] = []
        for url in self.urls:
            workers = None
            try:
                r = self._http.get(f"{url}/workers", timeout=10.0)
                if r.status_code == 200 and isinstance(r.json(), dict) and "workers" in r.json():
                    workers = [w["url"].rstrip("/") for w in r.json()["workers"] if w.get("url")]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                workers = None
            targets.extend(workers if workers is not None else [url])
        return list(dict.fromkeys(targets))

    def _control(self, url: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self._http.post(f"{url}{route}", json=body, timeout=self.timeout_s)
        try:
            out = r.json()
        except ValueError:
            out = {"message": r.text}
        if r.status_code != 200 or (isinstance(out, dict) and out.get("success") is False):
            raise GenerationError(f"{url}{route}: HTTP {r.status_code}: {str(out)[:500]}")
        return out if isinstance(out, dict) else {"result": out}

    def _update_one(self, url: str, path: str, version: int) -> None:
        self._control(url, "/pause_generation", {"mode": "in_place"})
        try:
            self._control(url, "/update_weights_from_disk",
                          {"model_path": str(path), "weight_version": str(version), "flush_cache": False})
        finally:
            self._control(url, "/continue_generation", {})

    def update_weights(self, weights: Any, version: int) -> None:
        """Load the HF checkpoint directory ``weights`` on every server, in flight, tagged ``version``.

        Servers that cannot be reached are skipped (and marked dead); any other failure raises after
        generation has been resumed on that server. Raises when no server took the update.
        """
        if not isinstance(weights, (str, bytes)) and not hasattr(weights, "__fspath__"):
            raise TypeError("SGLangGenerator.update_weights takes an HF checkpoint directory path, "
                            f"got {type(weights).__name__}")
        targets = self._control_targets()
        results: dict[str, BaseException | None] = {}

        def run(url: str) -> None:
            try:
                self._update_one(url, str(weights), int(version))
                results[url] = None
            except BaseException as e:  # noqa: BLE001 - reported below
                results[url] = e

        threads = [threading.Thread(target=run, args=(u,)) for u in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        unreachable = [u for u, e in results.items() if isinstance(e, httpx.TransportError)]
        for u in unreachable:
            log.warning("update_weights: %s unreachable, skipped", u)
            self._mark_dead(u)
        failed = {u: e for u, e in results.items() if e is not None and u not in unreachable}
        if failed:
            raise GenerationError(f"update_weights to version {version} failed on {len(failed)} server(s): "
                                  + "; ".join(f"{u}: {e}" for u, e in failed.items()))
        if len(unreachable) == len(targets):
            raise GenerationError(f"update_weights: no server reachable among {targets}")
        self._version = int(version)

    def server_weight_versions(self) -> dict[str, str | None]:
        """``GET /get_weight_version`` of every control target (None where unreachable)."""
        out: dict[str, str | None] = {}
        for url in self._control_targets():
            try:
                out[url] = self._http.get(f"{url}/get_weight_version", timeout=10.0).json().get("weight_version")
            except (httpx.HTTPError, ValueError, AttributeError):
                out[url] = None
        return out


def _finish_type(o: dict[str, Any]) -> str | None:
    fr = o.get("meta_info", {}).get("finish_reason")
    if isinstance(fr, dict):
        return fr.get("type")
    return fr if isinstance(fr, str) else None
