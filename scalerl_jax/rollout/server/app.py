"""An SGLang-API HTTP server (FastAPI + uvicorn) for the embedded :class:`~scalerl_jax.rollout.engine.JaxEngine`.

It speaks the subset of SGLang's native API that RL trainers use, with SGLang's field names, so that the
same client (:mod:`scalerl_jax.rollout.client.sglang`) and ``sglang-router`` work with it and with real
SGLang servers. Launch: ``python -m scalerl_jax.serve --preset tiny --port 30000`` (see ``--help``).

Here are the route handlers (module-level; they find the engine and its driver, the thread that runs the engine's
scheduler with pause and continue (:class:`~scalerl_jax.rollout.engine.EngineDriver`), in ``app.state.server``)
and :func:`create_app`, which wires them; the wire format they speak, request bodies parsed and responses built
(every field of ``/generate``, what is refused, our extension fields), is :mod:`scalerl_jax.rollout.server.wire`.

Routes:

``POST /generate``
    SGLang's ``GenerateReqInput`` -> ``{"text", "output_ids", "meta_info"}`` per sample. One prompt with
    ``n == 1`` gives one object; otherwise a list, prompt-major (prompt 0's n samples first), as SGLang does.
``POST /update_weights_from_disk``
    Every field of SGLang's ``UpdateWeightFromDiskReqInput``: ``model_path``, ``weight_version`` (any string;
    an integer string is the per-token version, any other string gets the next integer and is reported by
    its name; absent: the next integer), ``abort_all_requests`` (honoured), ``load_format`` (``auto`` or
    ``safetensors``), ``flush_cache``, ``keep_pause``, ``torch_empty_cache``, ``is_async``,
    ``recapture_cuda_graph``, ``token_step`` (accepted; there is no prefix cache to flush, and SGLang itself
    does nothing with ``keep_pause``) -> ``{success, message, num_paused_requests}`` (HTTP 400 with ``success:
    false`` on failure). Loads an HF checkpoint directory (hf_io.SUPPORTED_ARCHS); generation in flight picks the
    weights up at
    its next decode chunk and keeps its KV cache (SGLang instead waits for in-flight requests unless paused).
``POST /pause_generation`` ``{mode: "abort" | "retract" | "in_place"}``
    ``in_place`` (and ``retract``, which is the same here): the running engine batch halts at its next
    decode-chunk boundary, keeping its KV cache, until ``/continue_generation``; the call returns once it
    has halted. ``abort``: running and queued requests return at once (after the decode chunk in flight)
    with finish reason abort; as in SGLang, a running request keeps the output tokens it already generated
    (with their log-probs and versions). In every mode the server stays paused: new requests queue until
    ``/continue_generation``.
``POST /continue_generation``, ``GET|POST /flush_cache`` (nothing to flush: answers as SGLang does),
``POST /abort_request`` ``{rid, abort_all}``, ``GET /get_weight_version`` (``{"weight_version": str}``),
``GET /health``, ``GET /health_generate``, ``GET /get_load``, ``GET /get_model_info`` (also ``/model_info``;
SGLang's fields), ``GET /get_server_info`` (also ``/server_info``; the ``ServerArgs`` fields clients and
``sglang-router`` read: ``model_path``, ``tp_size``, ``dp_size``, ``version``, ...), ``GET /stats`` (ours:
request counters and the recent control events, for tests and monitoring).

Our extensions besides ``/generate``'s (optional; real SGLang neither sends nor returns them):

- ``/get_model_info`` lists them in ``scalerl_extensions``;
- ``/get_server_info`` ``device_count``: the accelerator devices the engine computes on (real SGLang:
  ``tp_size * pp_size * dp_size``), for the trainer's compute accounting.

Batching (continuous): requests go straight to the engine's scheduler (:meth:`JaxEngine.submit`), which a
background thread drives chunk by chunk; requests arriving while a batch runs join it at the next decode-chunk
boundary, up to ``max_batch`` rows (beyond that they wait for free slots). ``/stats`` shows it happening
(``admitted_mid_batch``, ``max_running_rows``, ``running_rows``). Bad requests (empty or
out-of-vocabulary ids, negative ``max_new_tokens``, wrong types, malformed JSON, too long for the engine)
get HTTP 400 with SGLang's error body (:func:`~scalerl_jax.rollout.server.wire.error_response`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import jax
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from scalerl_jax.models.hf_io import hf_names
from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.engine import EngineDriver, JaxEngine
from scalerl_jax.rollout.server.wire import (
    BadRequest,
    completion_to_sglang,
    error_response,
    parse_abort_body,
    parse_generate_body,
    parse_pause_mode,
    parse_update_body,
)

log = logging.getLogger(__name__)


def engine_device_count(engine: JaxEngine) -> int:
    """Accelerator devices the engine computes on (those holding its weights), for compute accounting."""
    try:
        params = getattr(engine, "_params", None)
        devs = {d for leaf in jax.tree.leaves(params) for d in leaf.devices()} if params is not None else set()
    except (AttributeError, TypeError):
        devs = set()
    return len(devs) or max(1, jax.local_device_count())


@dataclass
class ServerInfo:
    """What ``/get_model_info`` and ``/get_server_info`` report."""

    model_path: str
    tokenizer_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class _AppState:
    """What the route handlers share (``app.state.server``): the engine, its driver (made at start-up) and the
    served weights' names. ``vocab`` and ``max_len`` are read once, when the app is made."""

    engine: JaxEngine
    info: ServerInfo
    tokenizer: Any
    weight_version: str  # the served weights' name (SGLang's weight_version string)
    version_names: dict[int, str]  # integer per-token version -> the weight_version string it was loaded under
    model_path: str  # the model now loaded
    eos_ids: tuple[int, ...]
    devices: int
    vocab: int
    max_len: int
    batch_wait_s: float
    chunk_delay_s: float
    in_flight: int = 0  # prompts in flight
    driver: EngineDriver | None = None
    # serialises weight updates; asyncio binds it to the running loop on first use
    update_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _server(request: Request) -> _AppState:
    return request.app.state.server


async def _lifespan(app: FastAPI):
    st: _AppState = app.state.server
    st.driver = EngineDriver(st.engine, batch_wait_s=st.batch_wait_s, chunk_delay_s=st.chunk_delay_s)
    try:
        yield
    finally:
        st.driver.shutdown()


async def _read_json(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"malformed JSON body: {e}") from e


async def _bad_request(request: Request, exc: BadRequest):
    d = _server(request).driver
    if d is not None:
        with d._cond:
            d.stats["bad_requests"] += 1
    return error_response(str(exc), 400)


async def _internal_error(request: Request, exc: Exception):
    log.exception("unhandled error on %s", request.url.path)
    return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)


# ``/generate``: SGLang's GenerateReqInput -> one response object, or a list (prompt-major).
async def _generate(request: Request):
    st = _server(request)
    body = await _read_json(request)
    reqs, opts = parse_generate_body(body, st.vocab, st.max_len, st.tokenizer, st.eos_ids)
    t0 = time.time()
    st.in_flight += len(reqs)
    try:
        try:
            fut = st.driver.submit(reqs, asyncio.get_running_loop())
        except ValueError as e:  # the engine refused them
            raise BadRequest(str(e)) from e
        comps = await fut
    finally:
        st.in_flight -= len(reqs)
    e2e = time.time() - t0
    version = st.weight_version
    outs = []
    for r, cs in zip(reqs, comps):
        for c in cs:
            rid = r.request_id if r.params.n == 1 else f"{r.request_id}_{c.sample_index}"
            outs.append(completion_to_sglang(
                c, rid=rid, return_logprob=opts.return_logprob, weight_version=version, e2e=e2e,
                tokenizer=st.tokenizer, version_names=st.version_names,
                return_text_in_logprobs=opts.return_text_in_logprobs,
                return_prompt_token_ids=opts.return_prompt_token_ids))
    return outs[0] if opts.single else outs


async def _abort_all(d: EngineDriver) -> int:
    """Abort every running and queued request (they answer finish_reason abort); the pause state is kept."""
    fn = getattr(d, "abort_all", None)
    if fn is not None:
        return int(await asyncio.to_thread(fn))
    was_paused = d.paused
    n = await asyncio.to_thread(d.pause, "abort")
    if not was_paused:
        d.resume()
    return n


# ``/update_weights_from_disk``: load an HF checkpoint directory under a new weight version.
async def _update_weights_from_disk(request: Request):
    st = _server(request)
    body = await _read_json(request)
    wv = parse_update_body(body)
    async with st.update_lock:
        # SGLang's weight_version is any string; per-token versions here are integers: an integer string is
        # used as is, any other string gets the next integer and is reported by its name
        if wv is None:
            version = st.engine.weight_version + 1
        else:
            try:
                version = int(str(wv))
            except ValueError:
                version = max([st.engine.weight_version, *st.version_names]) + 1
        name = str(version) if wv is None else str(wv)
        st.driver.event("update_weights_from_disk", weight_version=name, model_path=body["model_path"])
        n_aborted = await _abort_all(st.driver) if body.get("abort_all_requests") else 0
        try:
            await asyncio.to_thread(st.engine.update_weights, body["model_path"], version)
        except (OSError, ValueError) as e:
            return JSONResponse({"success": False, "message": f"Failed to update weights: {e}",
                                 "num_paused_requests": 0}, status_code=400)
        st.version_names[version] = name
        st.weight_version = name
        st.model_path = body["model_path"]  # as SGLang's TokenizerManager does after an update
    msg = "Succeeded to update model weights."
    if wv is not None:
        msg += f" Weight version updated to {name}."
    if n_aborted:
        msg += f" Aborted {n_aborted} requests first (abort_all_requests)."
    return {"success": True, "message": msg, "num_paused_requests": 0}


# ``/pause_generation``: pause in place, retract or abort; returns once the engine has halted.
async def _pause_generation(request: Request):
    d = _server(request).driver
    body = await _read_json(request)
    mode = parse_pause_mode(body)
    n = await asyncio.to_thread(d.pause, mode)
    d.event("pause_generation", mode=mode, requests=n)
    return {"message": "Generation paused successfully.", "status": "ok", "num_paused_requests": n}


# ``/continue_generation``: resume after a pause.
async def _continue_generation(request: Request):
    d = _server(request).driver
    await _read_json(request)  # {torch_empty_cache} (0.5.23): nothing to empty here
    d.event("continue_generation")
    d.resume()
    return {"message": "Generation continued successfully.", "status": "ok"}


# ``/flush_cache``: there is no prefix cache to flush (every request is prefilled from scratch).
async def _flush_cache():
    return Response(content="Cache flushed.\nPlease check backend logs for more details. (When there are running "
                            "or waiting requests, the operation will not be performed.)\n", status_code=200)


# ``/abort_request``: abort every request (``abort_all``) or, where the driver can, one by ``rid``.
async def _abort_request(request: Request):
    d = _server(request).driver
    body = await _read_json(request)
    rid, abort_every = parse_abort_body(body)
    if abort_every:
        n = await _abort_all(d)
        d.event("abort_request", abort_all=True, requests=n)
        return Response(status_code=200)
    fn = getattr(d, "abort_request", None)
    if fn is None:
        raise BadRequest("aborting one request by rid is not supported by this server; use abort_all")
    await asyncio.to_thread(fn, rid)
    d.event("abort_request", rid=rid)
    return Response(status_code=200)


# ``/get_weight_version``: the served weights' name.
async def _get_weight_version(request: Request):
    return {"weight_version": _server(request).weight_version}


# ``/health``: 200 while the driver thread runs, else 503.
async def _health(request: Request):
    return Response(status_code=200 if _server(request).driver.alive() else 503)


# ``/health_generate``: as ``/health`` (no test generation is run).
async def _health_generate(request: Request):
    return Response(status_code=200 if _server(request).driver.alive() else 503)


# ``/get_load``: SGLang's GetLoadReqOutput (managers/io_struct.py), one entry per data-parallel rank.
async def _get_load(request: Request):
    return [{"dp_rank": 0, "num_reqs": _server(request).in_flight, "num_waiting_reqs": 0, "num_tokens": 0}]


def _model_fields(st: _AppState) -> dict[str, Any]:
    # model_path and weight_version move with a weight update, as in SGLang's TokenizerManager.update_weights_from_disk
    return {"model_path": st.model_path, "served_model_name": st.model_path,
            "tokenizer_path": st.info.tokenizer_path, "is_generation": True, "preferred_sampling_params": None,
            "weight_version": st.weight_version, "load_format": "auto", "reasoning_parser": None,
            "tool_call_parser": None, "disaggregation_mode": "null", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": hf_names(st.engine.cfg)[1],
            "architectures": [hf_names(st.engine.cfg)[0]],
            ws.EXTENSIONS_KEY: ws.EXTENSIONS, "vocab_size": st.vocab, "max_len": st.max_len,
            "max_batch": st.engine.max_batch, **st.info.extra}


# ``/get_model_info`` (also ``/model_info``): SGLang's fields, then our extensions.
def _model_info(request: Request) -> dict[str, Any]:
    return _model_fields(_server(request))


# ``/get_server_info`` (also ``/server_info``): the ServerArgs fields real SGLang reports (sglang-router reads
# model_path, tp_size, dp_size, ...), then ours.
def _server_info(request: Request) -> dict[str, Any]:
    st = _server(request)
    engine, max_len = st.engine, st.max_len
    return {**_model_fields(st), "tp_size": 1, "pp_size": 1, "dp_size": 1, "ep_size": 1, "enable_dp_attention": False,
            "load_balance_method": "round_robin", "context_length": max_len,
            "max_running_requests": engine.max_batch, "max_total_num_tokens": engine.max_batch * max_len,
            "max_prefill_tokens": engine.max_batch * max_len, "skip_tokenizer_init": st.tokenizer is None,
            "dtype": engine.cfg.dtype, ws.DEVICE_COUNT: st.devices, "internal_states": [{}],
            "model_config": dataclasses.asdict(engine.cfg),
            "decode_chunk": engine.decode_chunk, "paused": st.driver.paused,
            "version": ws.SERVER_VERSION}  # real SGLang reports its release (e.g. "0.5.3")


# ``/stats`` (ours): request counters, scheduler counters and the recent control events.
async def _stats(request: Request):
    st = _server(request)
    d = st.driver
    with d._cond:
        return {**d.stats, "paused": d.paused, "weight_version": st.weight_version, "events": list(d.events)}


# (path, handler, methods); each route is named after its handler without the underscore, as before (the names
# make the OpenAPI operation ids; the handlers have comments, not docstrings, which OpenAPI would publish)
_ROUTES = (
    (ws.GENERATE, _generate, ["POST", "PUT"]),
    (ws.UPDATE_WEIGHTS, _update_weights_from_disk, ["POST"]),
    (ws.PAUSE, _pause_generation, ["POST"]),
    (ws.CONTINUE, _continue_generation, ["POST"]),
    (ws.FLUSH_CACHE, _flush_cache, ["GET", "POST"]),
    (ws.ABORT, _abort_request, ["POST"]),
    (ws.WEIGHT_VERSION, _get_weight_version, ["GET"]),
    (ws.HEALTH, _health, ["GET"]),
    (ws.HEALTH_GENERATE, _health_generate, ["GET"]),
    (ws.LOAD, _get_load, ["GET"]),
    (ws.MODEL_INFO, _model_info, ["GET"]),
    (ws.MODEL_INFO_ALIAS, _model_info, ["GET"]),
    (ws.SERVER_INFO, _server_info, ["GET"]),
    (ws.SERVER_INFO_ALIAS, _server_info, ["GET"]),
    (ws.STATS, _stats, ["GET"]),
)


def create_app(engine: JaxEngine, info: ServerInfo, *, tokenizer: Any = None, weight_version: str | None = None,
               batch_wait_s: float = 0.02, chunk_delay_s: float = 0.0) -> FastAPI:
    """The FastAPI app serving ``engine``; the driver thread starts with the app and stops at shutdown."""
    name = weight_version if weight_version is not None else str(engine.weight_version)
    app = FastAPI(lifespan=_lifespan, title="scalerl_jax SGLang-API server")
    app.state.server = _AppState(
        engine=engine, info=info, tokenizer=tokenizer, weight_version=name,
        version_names={engine.weight_version: name}, model_path=info.model_path,
        eos_ids=(engine.cfg.eos_token_id,) if engine.cfg.eos_token_id is not None else (),
        devices=engine_device_count(engine), vocab=engine.cfg.vocab_size, max_len=engine.max_len,
        batch_wait_s=batch_wait_s, chunk_delay_s=chunk_delay_s,
    )
    app.add_exception_handler(BadRequest, _bad_request)
    app.add_exception_handler(Exception, _internal_error)
    for path, handler, methods in _ROUTES:
        app.add_api_route(path, handler, methods=methods, name=handler.__name__.removeprefix("_"))
    return app
