"""An SGLang-API HTTP server (FastAPI + uvicorn) for the embedded :class:`~scalerl_jax.rollout.engine.JaxEngine`.

It speaks the subset of SGLang's native API that RL trainers use, with SGLang's field names, so that the
same client (:mod:`scalerl_jax.rollout.sglang_client`) and ``sglang-router`` work with it and with real
SGLang servers. Launch: ``python -m scalerl_jax.serve --preset tiny --port 30000`` (see ``--help``).

Routes:

``POST /generate``
    ``input_ids``: a list of ids, or a list of lists (a batch); or ``text`` (a string or list) when the
    server has a tokenizer. ``sampling_params``: a dict, or a list with one dict per prompt; fields
    ``temperature``, ``top_p``, ``max_new_tokens``, ``stop_token_ids``, ``n`` (other SGLang fields are
    accepted and ignored). ``return_logprob`` (bool), ``rid`` (str or list). Unknown top-level fields are
    ignored (``sglang-router`` adds several). Response per sample: ``{"text", "output_ids", "meta_info"}``
    with ``meta_info``: ``id``, ``finish_reason`` (``{"type": "stop", "matched": id}``, ``{"type":
    "length", "length": n}`` or ``{"type": "abort", "message": ...}``), ``prompt_tokens``,
    ``completion_tokens``, ``cached_tokens`` (0), ``weight_version`` (str), ``e2e_latency`` and, with
    ``return_logprob``, ``output_token_logprobs`` as ``[logprob, token_id, null]`` triples. One prompt
    with ``n == 1`` gives one object; otherwise a list, prompt-major (prompt 0's n samples first), as
    SGLang does.
``POST /update_weights_from_disk``
    ``{model_path, weight_version, flush_cache, ...}`` -> ``{success, message, num_paused_requests}``
    (HTTP 400 with ``success: false`` on failure). Loads an HF LlamaForCausalLM directory; generation in
    flight picks the weights up at its next decode chunk and keeps its KV cache. ``weight_version`` must
    be an integer string here (our per-token versions are integers); ``flush_cache`` is accepted (there
    is no prefix cache to flush).
``POST /pause_generation`` ``{mode: "abort" | "retract" | "in_place"}``
    ``in_place`` (and ``retract``, which is the same here): the running engine batch halts at its next
    decode-chunk boundary, keeping its KV cache, until ``/continue_generation``; the call returns once it
    has halted. ``abort``: running and queued requests return at once with finish reason abort and no
    output tokens (partial tokens are dropped). In every mode the server stays paused: new requests queue
    until ``/continue_generation``.
``POST /continue_generation``, ``GET /get_weight_version`` (``{"weight_version": str}``),
``GET /health``, ``GET /health_generate``, ``GET /get_model_info`` (also ``/model_info``),
``GET /get_server_info`` (also ``/server_info``), ``GET /stats`` (ours: request counters and the recent
control events, for tests and monitoring).

Our extensions (optional; real SGLang neither sends nor returns them):

- request ``length_control``: ``{think_end_ids, interruption_ids, budget_lo, budget_hi, answer_budget}``
  (interruption length control, see :class:`~scalerl_jax.rollout.protocol.LengthControl`);
- ``meta_info``: ``output_token_versions`` (policy version per output token, -1 for injected tokens),
  ``output_token_injected`` (bools), ``think_budget`` (int or null), ``truncated`` (bool) and
  ``scalerl_finish_reason`` (``"stop" | "length" | "interrupted" | "abort"``; SGLang's ``finish_reason``
  reports ``"interrupted"`` as ``"stop"``);
- ``/get_model_info`` lists them in ``scalerl_extensions``.

Batching: a background thread takes every queued request (after a short collection window) and runs them
as one ``JaxEngine.generate`` call; requests arriving meanwhile form the next batch. Bad requests (empty or
out-of-vocabulary ids, negative ``max_new_tokens``, wrong types, malformed JSON, too long for the engine)
get HTTP 400 with a message in SGLang's error shape ``{"object": "error", "message", "type", "code"}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import queue
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.protocol import Completion, GenerationRequest, LengthControl, SamplingParams

log = logging.getLogger(__name__)

EXTENSIONS = ["length_control", "output_token_versions", "output_token_injected", "think_budget", "truncated",
              "scalerl_finish_reason"]
PAUSE_MODES = ("abort", "retract", "in_place")


class BadRequest(ValueError):
    """A client error: answered with HTTP 400 and this message."""


class _Aborted(Exception):
    """Raised inside the engine's chunk hook to abandon the running batch (pause mode abort)."""


def error_response(message: str, code: int = 400) -> JSONResponse:
    """SGLang's error body shape."""
    kind = {400: "Bad Request", 404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}
    return JSONResponse({"object": "error", "message": message, "type": kind.get(code, str(code)), "param": None,
                         "code": code}, status_code=code)


# ---- request parsing -------------------------------------------------------------------------------------


def _int(v: Any, name: str, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{name} must be an integer, got {json.dumps(v)[:50]}")
    if lo is not None and v < lo:
        raise BadRequest(f"{name} must be >= {lo}, got {v}")
    return v


def _num(v: Any, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"{name} must be a number, got {json.dumps(v)[:50]}")
    return float(v)


def _ids(v: Any, name: str, vocab: int, allow_empty: bool = False) -> list[int]:
    if not isinstance(v, list):
        raise BadRequest(f"{name} must be a list of token ids, got {type(v).__name__}")
    if not v and not allow_empty:
        raise BadRequest(f"{name} is empty")
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int):
            raise BadRequest(f"{name}[{i}] must be an integer token id, got {json.dumps(t)[:50]}")
        if not 0 <= t < vocab:
            raise BadRequest(f"{name}[{i}] = {t} is outside the vocabulary [0, {vocab})")
    return list(v)


def parse_sampling(sp: Any, name: str, vocab: int) -> SamplingParams:
    """SGLang ``sampling_params`` dict -> our SamplingParams (unsupported SGLang fields are ignored)."""
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest(f"{name} must be an object, got {type(sp).__name__}")
    kw: dict[str, Any] = {}
    if sp.get("temperature") is not None:
        kw["temperature"] = _num(sp["temperature"], f"{name}.temperature")
    if sp.get("top_p") is not None:
        kw["top_p"] = _num(sp["top_p"], f"{name}.top_p")
    kw["max_new_tokens"] = _int(sp.get("max_new_tokens", 16), f"{name}.max_new_tokens", 0)  # SGLang's default
    if sp.get("n") is not None:
        kw["n"] = _int(sp["n"], f"{name}.n", 1)
    if sp.get("stop_token_ids") is not None:
        kw["stop_token_ids"] = tuple(_ids(sp["stop_token_ids"], f"{name}.stop_token_ids", vocab, True))
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        raise BadRequest(str(e)) from e


def parse_length(lc: Any, vocab: int) -> LengthControl | None:
    if lc is None:
        return None
    if not isinstance(lc, dict):
        raise BadRequest(f"length_control must be an object, got {type(lc).__name__}")
    try:
        return LengthControl(
            think_end_ids=tuple(_ids(lc.get("think_end_ids"), "length_control.think_end_ids", vocab)),
            interruption_ids=tuple(_ids(lc.get("interruption_ids"), "length_control.interruption_ids", vocab)),
            budget_lo=_int(lc.get("budget_lo"), "length_control.budget_lo", 1),
            budget_hi=_int(lc.get("budget_hi"), "length_control.budget_hi", 1),
            answer_budget=_int(lc.get("answer_budget"), "length_control.answer_budget", 0),
        )
    except ValueError as e:
        raise BadRequest(str(e)) from e


def _as_list(v: Any, n: int, name: str) -> list[Any]:
    if isinstance(v, list):
        if len(v) != n:
            raise BadRequest(f"{name} has {len(v)} entries for {n} prompts")
        return v
    return [v] * n


def parse_generate(
    body: Any, vocab: int, max_len: int, tokenizer: Any = None
) -> tuple[list[GenerationRequest], bool, bool]:
    """A ``/generate`` body -> (requests, return_logprob, single) where ``single`` means one prompt, n == 1."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("stream=true is not supported by this server")
    ids, text = body.get("input_ids"), body.get("text")
    if ids is None and text is None:
        raise BadRequest("one of input_ids or text is required")
    if ids is not None and text is not None:
        raise BadRequest("give either input_ids or text, not both")
    if text is not None:
        if tokenizer is None:
            raise BadRequest("this server has no tokenizer: send input_ids")
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise BadRequest("text must be a string or a non-empty list of strings")
        try:
            prompts = [tokenizer.encode(t) for t in texts]
        except ValueError as e:
            raise BadRequest(f"text could not be tokenized: {e}") from e
        batched = not isinstance(text, str)
    else:
        if not isinstance(ids, list) or not ids:
            raise BadRequest("input_ids must be a non-empty list of token ids or a list of such lists")
        batched = isinstance(ids[0], list)
        prompts = ids if batched else [ids]
    prompts = [_ids(p, f"input_ids[{i}]" if batched else "input_ids", vocab) for i, p in enumerate(prompts)]
    k = len(prompts)
    sps = [parse_sampling(sp, "sampling_params" + (f"[{i}]" if k > 1 else ""), vocab)
           for i, sp in enumerate(_as_list(body.get("sampling_params"), k, "sampling_params"))]
    rl = body.get("return_logprob", False)
    rl = rl[0] if isinstance(rl, list) and rl else rl
    if rl is not None and not isinstance(rl, bool):
        raise BadRequest(f"return_logprob must be a boolean, got {json.dumps(rl)[:50]}")
    rids = _as_list(body.get("rid"), k, "rid")
    lengths = _as_list(body.get("length_control"), k, "length_control")
    reqs = []
    for i, (p, sp, rid, lc) in enumerate(zip(prompts, sps, rids, lengths)):
        if rid is not None and not isinstance(rid, str):
            raise BadRequest(f"rid must be a string, got {json.dumps(rid)[:50]}")
        lcp = parse_length(lc, vocab)
        where = f"prompt {i}" if k > 1 else "the prompt"
        if len(p) + sp.max_new_tokens > max_len:
            raise BadRequest(f"{where}: {len(p)} prompt tokens + max_new_tokens {sp.max_new_tokens} exceeds the "
                             f"server's max_len {max_len}")
        if lcp is not None:
            need = lcp.budget_hi + len(lcp.interruption_ids) + lcp.answer_budget
            if sp.max_new_tokens < need:
                raise BadRequest(f"{where}: with length_control, max_new_tokens {sp.max_new_tokens} must be at least "
                                 f"budget_hi + len(interruption_ids) + answer_budget = {need}")
        reqs.append(GenerationRequest(prompt_ids=p, params=sp, length=lcp, request_id=rid or uuid.uuid4().hex))
    return reqs, bool(rl), (k == 1 and not batched and sps[0].n == 1)


# ---- the batching driver -------------------------------------------------------------------------------


@dataclass
class _Job:
    requests: list[GenerationRequest]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    t_submit: float = field(default_factory=time.time)


class EngineDriver:
    """Runs queued jobs on the engine in batches; implements pause (in place / abort) and continue.

    Pause in place blocks the engine's ``chunk_hook`` (called on the generating thread between decode
    chunks), so the batch keeps its KV cache and resumes where it stopped; weights installed meanwhile are
    picked up at the next chunk.
    """

    def __init__(self, engine: JaxEngine, *, batch_wait_s: float = 0.005, chunk_delay_s: float = 0.0):
        self.engine = engine
        self.batch_wait_s = batch_wait_s
        self.chunk_delay_s = chunk_delay_s  # testing aid: slows generation down so that tests can act mid-batch
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._cond = threading.Condition()
        self._paused = False
        self._abort_gen = 0  # bumped by pause(abort); a running batch compares it with its own at start
        self._batch_abort_gen = 0
        self._halted = False  # the running batch is parked in the chunk hook
        self._running: list[_Job] = []
        self._stop = False
        self.stats = {"generate_requests": 0, "prompts": 0, "samples": 0, "engine_batches": 0, "completion_tokens": 0,
                      "aborted_requests": 0, "bad_requests": 0}
        self.events: deque[dict[str, Any]] = deque(maxlen=200)
        engine.chunk_hook = self._chunk_hook
        self._thread = threading.Thread(target=self._loop, name="engine-driver", daemon=True)
        self._thread.start()

    # -- called from the event loop --

    def submit(self, requests: list[GenerationRequest], loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        fut = loop.create_future()
        with self._cond:
            self.stats["generate_requests"] += 1
            self.stats["prompts"] += len(requests)
            self.stats["samples"] += sum(r.params.n for r in requests)
        self._queue.put(_Job(requests, fut, loop))
        return fut

    def event(self, name: str, **kw: Any) -> None:
        with self._cond:
            self.events.append({"t": time.time(), "event": name, "in_flight": len(self._running),
                                "halted": self._halted, **kw})

    def pause(self, mode: str, timeout_s: float = 60.0) -> int:
        """Pause; returns the number of requests held (in place) or aborted."""
        with self._cond:
            self._paused = True
            n = sum(len(j.requests) for j in self._running)
            if mode == "abort":
                self._abort_gen += 1
                self._cond.notify_all()
            else:
                deadline = time.monotonic() + timeout_s
                while self._running and not self._halted and time.monotonic() < deadline:
                    self._cond.wait(0.05)
        if mode == "abort":
            aborted = self._drain_queue()
            n += aborted
        return n

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._paused = False
            self._cond.notify_all()

    # -- driver thread --

    def _drain_queue(self) -> int:
        n = 0
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return n
            n += len(job.requests)
            self._finish(job, [[_aborted(r, j) for j in range(r.params.n)] for r in job.requests])

    def _chunk_hook(self, chunk_index: int) -> None:
        if self.chunk_delay_s:
            time.sleep(self.chunk_delay_s)
        with self._cond:
            my_gen = self._batch_abort_gen
            while self._paused and self._abort_gen == my_gen and not self._stop:
                self._halted = True
                self._cond.notify_all()
                self._cond.wait(0.1)
            self._halted = False
            if self._abort_gen != my_gen:
                raise _Aborted()

    def _loop(self) -> None:
        while not self._stop:
            with self._cond:
                while self._paused and not self._stop:
                    self._cond.wait(0.1)
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if self.batch_wait_s:
                time.sleep(self.batch_wait_s)
            jobs = [first]
            while True:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            with self._cond:
                if self._paused:  # paused while we were collecting: put them back in order
                    rest = []
                    while True:
                        try:
                            rest.append(self._queue.get_nowait())
                        except queue.Empty:
                            break
                    for j in jobs + rest:
                        self._queue.put(j)
                    continue
                self._running = jobs
                self._batch_abort_gen = self._abort_gen
            self._run(jobs)
            with self._cond:
                self._running = []
                self._cond.notify_all()

    def _run(self, jobs: list[_Job]) -> None:
        reqs = [r for j in jobs for r in j.requests]
        try:
            outs = self.engine.generate(reqs)
        except _Aborted:
            with self._cond:
                self.stats["aborted_requests"] += len(reqs)
            for j in jobs:
                self._finish(j, [[_aborted(r, s) for s in range(r.params.n)] for r in j.requests])
            return
        except Exception as e:  # noqa: BLE001 - every waiting HTTP call must get an answer
            log.exception("engine batch failed")
            for j in jobs:
                j.loop.call_soon_threadsafe(_set_exc, j.future, e)
            return
        with self._cond:
            self.stats["engine_batches"] += 1
            self.stats["completion_tokens"] += sum(len(c.token_ids) for cs in outs for c in cs)
        i = 0
        for j in jobs:
            self._finish(j, outs[i : i + len(j.requests)])
            i += len(j.requests)

    @staticmethod
    def _finish(job: _Job, result: list[list[Completion]]) -> None:
        job.loop.call_soon_threadsafe(_set_result, job.future, result)


def _set_result(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut: asyncio.Future, e: BaseException) -> None:
    if not fut.done():
        fut.set_exception(e)


def _aborted(r: GenerationRequest, j: int) -> Completion:
    return Completion(request_id=r.request_id, sample_index=j, prompt_ids=list(r.prompt_ids), token_ids=[],
                      logprobs=[], versions=[], injected=[], finish_reason="abort")


# ---- responses -------------------------------------------------------------------------------------------


def completion_to_sglang(c: Completion, *, rid: str, return_logprob: bool, weight_version: str, e2e: float,
                         tokenizer: Any = None) -> dict:
    """One sample in SGLang's ``/generate`` response shape, plus our extension fields."""
    n = len(c.token_ids)
    if c.finish_reason == "abort":
        fr: dict[str, Any] = {"type": "abort", "message": "aborted by pause_generation(mode='abort')"}
    elif c.finish_reason == "length":
        fr = {"type": "length", "length": n}
    else:  # "stop" and "interrupted" (stopped while answering after an interruption)
        fr = {"type": "stop", "matched": c.token_ids[-1] if c.token_ids else None}
    text = ""
    if tokenizer is not None:
        try:
            text = tokenizer.decode(c.token_ids)
        except ValueError:
            text = ""
    meta: dict[str, Any] = {
        "id": rid, "finish_reason": fr, "prompt_tokens": len(c.prompt_ids), "completion_tokens": n,
        "cached_tokens": 0, "weight_version": weight_version, "e2e_latency": e2e,
        "output_token_versions": list(c.versions), "output_token_injected": list(c.injected),
        "think_budget": c.think_budget, "truncated": bool(c.truncated), "scalerl_finish_reason": c.finish_reason,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(c.logprobs, c.token_ids)]
    return {"text": text, "output_ids": list(c.token_ids), "meta_info": meta}


# ---- the app ---------------------------------------------------------------------------------------------


@dataclass
class ServerInfo:
    """What ``/get_model_info`` and ``/get_server_info`` report."""

    model_path: str
    tokenizer_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def create_app(engine: JaxEngine, info: ServerInfo, *, tokenizer: Any = None, weight_version: str | None = None,
               batch_wait_s: float = 0.005, chunk_delay_s: float = 0.0) -> FastAPI:
    """The FastAPI app serving ``engine``; the driver thread starts with the app and stops at shutdown."""
    state: dict[str, Any] = {"weight_version": weight_version if weight_version is not None
                             else str(engine.weight_version)}
    holder: dict[str, EngineDriver] = {}
    vocab, max_len = engine.cfg.vocab_size, engine.max_len
    update_lock = asyncio.Lock()

    async def lifespan(app: FastAPI):
        holder["driver"] = EngineDriver(engine, batch_wait_s=batch_wait_s, chunk_delay_s=chunk_delay_s)
        try:
            yield
        finally:
            holder["driver"].shutdown()

    app = FastAPI(lifespan=lifespan, title="scalerl_jax SGLang-API server")

    def driver() -> EngineDriver:
        return holder["driver"]

    async def read_json(request: Request) -> Any:
        raw = await request.body()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"malformed JSON body: {e}") from e

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, exc: BadRequest):
        if "driver" in holder:
            with driver()._cond:
                driver().stats["bad_requests"] += 1
        return error_response(str(exc), 400)

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(request: Request):
        body = await read_json(request)
        reqs, return_logprob, single = parse_generate(body, vocab, max_len, tokenizer)
        t0 = time.time()
        comps = await driver().submit(reqs, asyncio.get_running_loop())
        e2e = time.time() - t0
        version = state["weight_version"]
        outs = []
        for r, cs in zip(reqs, comps):
            for c in cs:
                rid = r.request_id if r.params.n == 1 else f"{r.request_id}_{c.sample_index}"
                outs.append(completion_to_sglang(c, rid=rid, return_logprob=return_logprob, weight_version=version,
                                                 e2e=e2e, tokenizer=tokenizer))
        return outs[0] if single else outs

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str) or not body["model_path"]:
            raise BadRequest("model_path (a non-empty string) is required")
        wv = body.get("weight_version")
        if wv is None:
            version = engine.weight_version + 1
        else:
            try:
                version = int(str(wv))
            except ValueError as e:
                raise BadRequest(f"weight_version must be an integer (string), got {wv!r}") from e
        async with update_lock:
            driver().event("update_weights_from_disk", weight_version=str(version), model_path=body["model_path"])
            try:
                await asyncio.to_thread(engine.update_weights, body["model_path"], version)
            except (OSError, ValueError) as e:
                return JSONResponse({"success": False, "message": f"Failed to update weights: {e}",
                                     "num_paused_requests": 0}, status_code=400)
            state["weight_version"] = str(version)
        return {"success": True, "message": f"Succeeded to update model weights. Weight version updated to {version}.",
                "num_paused_requests": 0}

    @app.post("/pause_generation")
    async def pause_generation(request: Request):
        body = await read_json(request)
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in PAUSE_MODES:
            raise BadRequest(f"mode must be one of {list(PAUSE_MODES)}, got {mode!r}")
        n = await asyncio.to_thread(driver().pause, mode)
        driver().event("pause_generation", mode=mode, requests=n)
        return {"message": "Generation paused successfully.", "status": "ok", "num_paused_requests": n}

    @app.post("/continue_generation")
    async def continue_generation(request: Request):
        await read_json(request)
        driver().event("continue_generation")
        driver().resume()
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.get("/get_weight_version")
    async def get_weight_version():
        return {"weight_version": state["weight_version"]}

    @app.get("/health")
    async def health():
        return Response(status_code=200 if driver().alive() else 503)

    @app.get("/health_generate")
    async def health_generate():
        return Response(status_code=200 if driver().alive() else 503)

    def model_info() -> dict[str, Any]:
        return {"model_path": info.model_path, "tokenizer_path": info.tokenizer_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": state["weight_version"],
                "scalerl_extensions": EXTENSIONS, "vocab_size": vocab, "max_len": max_len,
                "max_batch": engine.max_batch, **info.extra}

    app.get("/get_model_info")(model_info)
    app.get("/model_info")(model_info)

    def server_info() -> dict[str, Any]:
        return {**model_info(), "model_config": dataclasses.asdict(engine.cfg), "decode_chunk": engine.decode_chunk,
                "paused": driver().paused, "version": "scalerl_jax"}

    app.get("/get_server_info")(server_info)
    app.get("/server_info")(server_info)

    @app.get("/stats")
    async def stats():
        d = driver()
        with d._cond:
            return {**d.stats, "paused": d.paused, "weight_version": state["weight_version"],
                    "events": list(d.events)}

    return app
