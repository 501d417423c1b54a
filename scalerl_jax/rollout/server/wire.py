"""The wire format of our SGLang-API server (:mod:`scalerl_jax.rollout.server`): SGLang's request bodies parsed
into the protocol's :class:`~scalerl_jax.rollout.protocol.GenerationRequest` s, and completions built into SGLang's
``/generate`` response. Pure functions from JSON to the protocol's types and back: nothing here serves HTTP or
touches the engine. What the server refuses raises :class:`BadRequest`, answered with HTTP 400 and SGLang's error
body (:func:`error_response`).

``POST /generate`` (:func:`parse_generate_body`, :func:`completion_to_sglang`)
    SGLang's ``GenerateReqInput``: ``input_ids`` (a list of ids, or a list of lists: a batch) or ``text`` (a
    string or list) when the server has a tokenizer; ``sampling_params`` (a dict, or one per prompt);
    ``return_logprob``; ``rid`` (a string, ``{rid}_{i}`` per prompt of a batch, or a list);
    ``return_text_in_logprobs``, ``return_prompt_token_ids``. ``sampling_params`` takes every field name of
    SGLang's ``SamplingParams`` and refuses others (400, like SGLang 0.5.23): ``temperature``, ``top_p``,
    ``max_new_tokens`` (default 128), ``n``, ``stop_token_ids``, ``ignore_eos`` and ``top_k`` (-1, 1 or >= the
    vocabulary) are honoured; generation stops at the model's EOS unless ``ignore_eos`` (which, as in SGLang,
    disables ``stop_token_ids`` too); text-only fields (``skip_special_tokens``, ``no_stop_trim``, ...) are
    ignored; the rest (penalties, ``min_p``, ``min_new_tokens``, ``stop`` strings, grammars, ``logit_bias``)
    are accepted at their default only: another value is refused rather than silently ignored. Top-level
    fields we cannot honour when set (multimodal data, LoRA, ``top_logprobs_num``, hidden states, ...) are
    refused; other top-level fields are ignored (``sglang-router`` adds several). Response per sample:
    ``{"text", "output_ids", "meta_info"}`` with ``meta_info``: ``id``, ``finish_reason`` (``{"type":
    "stop", "matched": id}``, ``{"type": "length", "length": n}`` or ``{"type": "abort", "message",
    "status_code", "err_type"}``; an aborted request keeps its partial output), ``prompt_tokens``,
    ``weight_version`` (the server's, when the response is built), ``completion_tokens``, ``cached_tokens``
    (0), ``e2e_latency``, ``weight_versions`` (SGLang 0.5.19+'s spans ``[{version, start, end}]`` of the
    output tokens each weight version produced, ``end`` exclusive) and, with ``return_logprob``,
    ``output_token_logprobs`` as ``[logprob, token_id, text-or-null]`` triples.
``POST /update_weights_from_disk``, ``/pause_generation``, ``/abort_request``
    Their bodies are checked here (:func:`parse_update_body`, :func:`parse_pause_mode`,
    :func:`parse_abort_body`); what the routes do is the server's.

Our extensions (optional; real SGLang neither sends nor returns them; :data:`EXTENSIONS` names them):

- request ``length_control``: ``{think_end_ids, interruption_ids, budget_lo, budget_hi, answer_budget}``
  (interruption length control, see :class:`~scalerl_jax.rollout.protocol.LengthControl`);
- ``meta_info``: ``output_token_versions`` (policy version per output token, -1 for injected tokens),
  ``output_token_injected`` (bools), ``think_budget`` (int or null), ``truncated`` (bool) and
  ``scalerl_finish_reason`` (``"stop" | "length" | "interrupted" | "abort"``; SGLang's ``finish_reason``
  reports ``"interrupted"`` as ``"stop"``).

Bad requests (empty or out-of-vocabulary ids, negative ``max_new_tokens``, wrong types, too long for the
engine) get SGLang's error body ``{"error": {"message"}}`` (plus the OpenAI-style ``object``, ``message``,
``type``, ``code``).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from scalerl_jax.config import completion_budget_error
from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.protocol import INJECTED_VERSION, Completion, GenerationRequest, LengthControl, SamplingParams
from scalerl_jax.rollout.wire_schema import EXTENSIONS, PAUSE_MODES

__all__ = ["EXTENSIONS", "PAUSE_MODES", "BadRequest", "GenerateOptions", "completion_to_sglang", "error_response",
           "finish_reason_json", "parse_abort_body", "parse_generate_body", "parse_length", "parse_pause_mode",
           "parse_sampling", "parse_update_body", "weight_version_spans"]

log = logging.getLogger(__name__)

# UpdateWeightFromDiskReqInput's fields (managers/io_struct.py, 0.4.10.post2 .. 0.5.23; rid from BaseReq)
SGLANG_UPDATE_FIELDS = ("model_path", "load_format", "abort_all_requests", "weight_version", "is_async",
                        "torch_empty_cache", "keep_pause", "recapture_cuda_graph", "token_step", "flush_cache",
                        "manifest", "rid")


class BadRequest(ValueError):
    """A client error: answered with HTTP 400 and this message."""


def error_response(message: str, code: int = 400) -> JSONResponse:
    """An error body in both of SGLang's shapes: the native routes' ``{"error": {"message"}}``
    (``_create_error_response`` in entrypoints/http_server.py) and the OpenAI-style top-level ``object``,
    ``message``, ``type``, ``param``, ``code`` of its OpenAI routes."""
    kind = {400: "Bad Request", 404: "Not Found", 500: "Internal Server Error", 503: "Service Unavailable"}
    return JSONResponse({"error": {"message": message, "code": code}, "object": "error", "message": message,
                         "type": kind.get(code, str(code)), "param": None, "code": code}, status_code=code)


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


# Every field of real SGLang's ``sampling_params``, transcribed from its source: ``SamplingParams.__init__`` in
# python/sglang/srt/sampling/sampling_params.py (0.4.10.post2, 0.5.3, 0.5.5) and the ``SamplingParams`` contract
# in python/sglang/api/v1/api_types.py (0.5.23, which adds stop_regex, beam_width, watermark, choice). A key not
# listed here is refused with HTTP 400, as 0.5.23 does ("unknown keys rejected").
SGLANG_SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "custom_params", "stream_interval", "logit_bias", "sampling_seed", "beam_width", "watermark", "choice",
)
SGLANG_MAX_NEW_TOKENS_DEFAULT = 128  # SamplingParams.__init__'s default in every release read


def _empty(v: Any) -> bool:
    return v is None or v == "" or (isinstance(v, (list, dict)) and not v)


def _equals(default: float) -> Any:
    return lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == default)


# Fields the engine cannot honour, with the test for their "off" value. Anything else is refused rather than
# ignored: ignoring it would sample from another distribution than the one the caller's log-probs assume.
# (skip_special_tokens, spaces_between_special_tokens, no_stop_trim, stream_interval, sampling_seed and
# custom_params are accepted and ignored: they shape the detokenised text, streaming or a seed only, and
# custom_params is read by nothing but a custom logit processor, which is refused at the top level.)
_ONLY_OFF = {
    "stop": _empty, "stop_regex": _empty, "json_schema": _empty, "regex": _empty, "ebnf": _empty,
    "structural_tag": _empty, "logit_bias": _empty, "choice": _empty,
    "min_p": _equals(0.0), "frequency_penalty": _equals(0.0), "presence_penalty": _equals(0.0),
    "repetition_penalty": _equals(1.0), "min_new_tokens": _equals(0), "beam_width": _equals(1),
    "watermark": lambda v: _empty(v) or (isinstance(v, dict) and v.get("enabled") is False),
}


def _bool(v: Any, name: str) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"{name} must be a boolean, got {json.dumps(v)[:50]}")
    return v


def parse_sampling(sp: Any, name: str, vocab: int, *, eos_token_ids: tuple[int, ...] = (),
                   room: int | None = None) -> SamplingParams:
    """SGLang ``sampling_params`` dict -> our SamplingParams, with SGLang's semantics.

    Honoured: ``temperature``, ``top_p``, ``max_new_tokens`` (default 128; ``null`` = up to ``room``, the space
    left in the sequence), ``n``, ``stop_token_ids``, ``ignore_eos`` and ``top_k`` (-1 or >= the vocabulary =
    all tokens, 1 = greedy). As in SGLang, generation also stops at the model's EOS (``eos_token_ids``) unless
    ``ignore_eos``, which disables ``stop_token_ids`` too (``Req.check_finished`` in managers/schedule_batch.py).
    Unknown keys, and other values than the default for fields the engine cannot honour, raise
    :class:`BadRequest`.
    """
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest(f"{name} must be an object, got {type(sp).__name__}")
    unknown = [k for k in sp if k not in SGLANG_SAMPLING_FIELDS]
    if unknown:
        raise BadRequest(f"{name}: unknown field `{unknown[0]}`, expected one of "
                         + ", ".join(f"`{f}`" for f in SGLANG_SAMPLING_FIELDS))
    for k, is_off in _ONLY_OFF.items():
        if k in sp and not is_off(sp[k]):
            raise BadRequest(f"{name}.{k} = {json.dumps(sp[k])[:80]} is not supported by this server (only its "
                             "default is)")
    for k in ("skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
        if sp.get(k) is not None:
            _bool(sp[k], f"{name}.{k}")
    kw: dict[str, Any] = {}
    if sp.get("temperature") is not None:
        kw["temperature"] = _num(sp["temperature"], f"{name}.temperature")
    if sp.get("top_p") is not None:
        kw["top_p"] = _num(sp["top_p"], f"{name}.top_p")
    if sp.get("top_k") is not None:
        top_k = _int(sp["top_k"], f"{name}.top_k")
        if top_k < 1 and top_k != -1:
            raise BadRequest(f"{name}.top_k must be -1 (disable) or at least 1, got {top_k}")
        if top_k == 1:  # greedy; SGLang itself turns temperature 0 into top_k 1
            if kw.get("temperature", 1.0) not in (0.0, 1.0):
                raise BadRequest(f"{name}: top_k 1 with temperature {kw['temperature']} is not supported by this "
                                 "server (use temperature 0 for greedy decoding)")
            kw["temperature"] = 0.0
        elif top_k != -1 and top_k < vocab:
            raise BadRequest(f"{name}.top_k = {top_k} is not supported by this server (only -1, 1, or at least "
                             f"the vocabulary size {vocab})")
    mnt = sp.get("max_new_tokens", SGLANG_MAX_NEW_TOKENS_DEFAULT)
    if mnt is None:
        if room is None:
            raise BadRequest(f"{name}.max_new_tokens must be an integer, got null")
        mnt = max(0, room)
    kw["max_new_tokens"] = _int(mnt, f"{name}.max_new_tokens", 0)
    if sp.get("n") is not None:
        kw["n"] = _int(sp["n"], f"{name}.n", 1)
    stops: list[int] = []
    if sp.get("stop_token_ids") is not None:
        stops = _ids(sp["stop_token_ids"], f"{name}.stop_token_ids", vocab, True)
    if sp.get("ignore_eos") is not None and _bool(sp["ignore_eos"], f"{name}.ignore_eos"):
        stops = []
    else:
        stops += [int(t) for t in eos_token_ids if 0 <= int(t) < vocab and int(t) not in stops]
    if stops:
        kw["stop_token_ids"] = tuple(dict.fromkeys(stops))
    try:
        return SamplingParams(**kw)
    except ValueError as e:
        raise BadRequest(str(e)) from e


def parse_length(lc: Any, vocab: int) -> LengthControl | None:
    if lc is None:
        return None
    if not isinstance(lc, dict):
        raise BadRequest(f"{ws.LENGTH_CONTROL} must be an object, got {type(lc).__name__}")
    ids = {f: tuple(_ids(lc.get(f), f"{ws.LENGTH_CONTROL}.{f}", vocab)) for f in ws.LENGTH_FIELDS[:2]}
    try:  # budget_lo, budget_hi >= 1, answer_budget >= 0
        return LengthControl(**ids, **{f: _int(lc.get(f), f"{ws.LENGTH_CONTROL}.{f}", low)
                                       for f, low in zip(ws.LENGTH_FIELDS[2:], (1, 1, 0), strict=True)})
    except ValueError as e:
        raise BadRequest(str(e)) from e


def _as_list(v: Any, n: int, name: str) -> list[Any]:
    if isinstance(v, list):
        if len(v) != n:
            raise BadRequest(f"{name} has {len(v)} entries for {n} prompts")
        return v
    return [v] * n


# Top-level /generate fields (GenerateReqInput in managers/io_struct.py) that this server cannot honour: a
# request that sets them is refused (400) instead of being answered as if they were absent. Every other field is
# accepted; those we do not use are ignored, as SGLang ignores unknown top-level fields (sglang-router adds
# ``model``, ``log_metrics``, ``background``, ``no_logs``, ``return_bytes``, ``return_entropy``: false, ...).
_REFUSED_IF_SET = ("input_embeds", "image_data", "video_data", "audio_data", "lora_path", "lora_id",
                   "custom_logit_processor", "session_params", "token_ids_logprob", "positional_embed_overrides",
                   "max_thinking_tokens", "bootstrap_host", "bootstrap_room")
_REFUSED_IF_TRUE = ("return_hidden_states", "return_routed_experts", "return_indexer_topk", "return_entropy",
                    "return_sampling_mask", "return_bytes")


@dataclass
class GenerateOptions:
    """What a ``/generate`` body asks of the response (besides the requests themselves)."""

    return_logprob: bool = False
    single: bool = True  # one prompt, n == 1: answer one object rather than a list
    return_text_in_logprobs: bool = False
    return_prompt_token_ids: bool = False


def parse_generate_body(
    body: Any, vocab: int, max_len: int, tokenizer: Any = None, eos_token_ids: tuple[int, ...] = ()
) -> tuple[list[GenerationRequest], GenerateOptions]:
    """A ``/generate`` body (SGLang's ``GenerateReqInput``) -> (requests, response options).

    Batches follow SGLang's ``normalize_batch_and_arguments``: ``input_ids`` a list of lists or ``text`` a list;
    ``sampling_params`` and ``rid`` either one value for all prompts or a list with one per prompt; a string
    ``rid`` of a batch becomes ``{rid}_{i}`` per prompt.
    """
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("stream=true is not supported by this server")
    for k in _REFUSED_IF_SET:
        if not _empty(body.get(k)):
            raise BadRequest(f"{k} is not supported by this server")
    for k in _REFUSED_IF_TRUE:
        if body.get(k) not in (None, False):
            raise BadRequest(f"{k}={json.dumps(body[k])[:40]} is not supported by this server")
    if body.get("top_logprobs_num") not in (None, 0):
        raise BadRequest("top_logprobs_num is not supported by this server (output_token_logprobs only)")
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
    sps = [parse_sampling(sp, "sampling_params" + (f"[{i}]" if k > 1 else ""), vocab, eos_token_ids=eos_token_ids,
                          room=max_len - len(p))
           for i, (p, sp) in enumerate(zip(prompts, _as_list(body.get("sampling_params"), k, "sampling_params")))]
    rls = _as_list(body.get("return_logprob", False), k, "return_logprob")
    for rl in rls:
        if rl is not None and not isinstance(rl, bool):
            raise BadRequest(f"return_logprob must be a boolean, got {json.dumps(rl)[:50]}")
    if len({bool(rl) for rl in rls}) > 1:
        raise BadRequest("return_logprob must be the same for every prompt of a batch on this server")
    if rls[0] and body.get("logprob_start_len") not in (None, -1):
        raise BadRequest("logprob_start_len is not supported by this server (output_token_logprobs only)")
    rid = body.get("rid")
    rids = [f"{rid}_{i}" for i in range(k)] if isinstance(rid, str) and batched else _as_list(rid, k, "rid")
    lengths = _as_list(body.get(ws.LENGTH_CONTROL), k, ws.LENGTH_CONTROL)
    reqs = []
    for i, (p, sp, rid_i, lc) in enumerate(zip(prompts, sps, rids, lengths)):
        if rid_i is not None and not isinstance(rid_i, str):
            raise BadRequest(f"rid must be a string, got {json.dumps(rid_i)[:50]}")
        lcp = parse_length(lc, vocab)
        where = f"prompt {i}" if k > 1 else "the prompt"
        if len(p) + sp.max_new_tokens > max_len:
            raise BadRequest(f"{where}: {len(p)} prompt tokens + max_new_tokens {sp.max_new_tokens} exceeds the "
                             f"server's max_len {max_len}")
        err = None if lcp is None else completion_budget_error(sp.max_new_tokens, lcp.budget_hi,
                                                               len(lcp.interruption_ids), lcp.answer_budget)
        if err is not None:
            raise BadRequest(f"{where}: with {ws.LENGTH_CONTROL}, {err}")
        reqs.append(GenerationRequest(prompt_ids=p, params=sp, length=lcp, request_id=rid_i or uuid.uuid4().hex))
    opts = GenerateOptions(
        return_logprob=bool(rls[0]), single=(k == 1 and not batched and sps[0].n == 1),
        return_text_in_logprobs=body.get("return_text_in_logprobs") is True,
        return_prompt_token_ids=body.get("return_prompt_token_ids") is True,
    )
    return reqs, opts


# ---- control-route bodies --------------------------------------------------------------------------------


def parse_update_body(body: Any) -> str | int | None:
    """A ``/update_weights_from_disk`` body (SGLang's ``UpdateWeightFromDiskReqInput``) checked; returns its
    ``weight_version`` (None when absent). Unknown fields are ignored (logged), as SGLang's dataclass does."""
    if not isinstance(body, dict) or not isinstance(body.get("model_path"), str) or not body["model_path"]:
        raise BadRequest("model_path (a non-empty string) is required")
    unknown = [k for k in body if k not in SGLANG_UPDATE_FIELDS]
    if unknown:
        log.info("update_weights_from_disk: ignoring unknown fields %s", unknown)  # as SGLang's dataclass does
    for k in ("abort_all_requests", "is_async", "torch_empty_cache", "keep_pause", "recapture_cuda_graph",
              "flush_cache"):
        if body.get(k) is not None:
            _bool(body[k], k)
    if body.get("token_step") is not None:
        _int(body["token_step"], "token_step")
    if body.get("load_format") not in (None, "auto", "safetensors"):
        raise BadRequest(f"load_format {body['load_format']!r} is not supported by this server (auto, "
                         "safetensors: an HF checkpoint directory)")
    if not _empty(body.get("manifest")):
        raise BadRequest("manifest is not supported by this server")
    wv = body.get("weight_version")
    if wv is not None and (isinstance(wv, bool) or not isinstance(wv, (str, int))):
        raise BadRequest(f"weight_version must be a string, got {json.dumps(wv)[:50]}")
    return wv


def parse_pause_mode(body: Any) -> str:
    """The ``mode`` of a ``/pause_generation`` body (``abort`` when absent)."""
    mode = body.get("mode", ws.PAUSE_DEFAULT) if isinstance(body, dict) else None
    if mode not in PAUSE_MODES:
        raise BadRequest(f"mode must be one of {list(PAUSE_MODES)}, got {mode!r}")
    return mode


def parse_abort_body(body: Any) -> tuple[str, bool]:
    """An ``/abort_request`` body (SGLang's ``AbortReq``) -> (``rid``, ``abort_all``)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object {rid, abort_all}")
    rid = body.get("rid") or ""
    if not isinstance(rid, str):
        raise BadRequest(f"rid must be a string, got {json.dumps(rid)[:50]}")
    return rid, body.get("abort_all") is not None and _bool(body["abort_all"], "abort_all")


# ---- responses -------------------------------------------------------------------------------------------


def weight_version_spans(versions: list[int], names: dict[int, str] | None = None,
                         current: str | None = None) -> list[dict[str, Any]]:
    """Per-token versions -> SGLang 0.5.23's ``meta_info.weight_versions``: ``[{version, start, end}]`` over the
    output tokens, ``end`` exclusive, in order (utils/weight_versions.py ``compute_weight_version_spans``).

    Injected tokens (``INJECTED_VERSION``) were produced by no weights; they join the span of the token before
    them (or after them, at the start) so that the spans still cover every output token, as SGLang's do. No
    output tokens: one empty span of ``current``, as SGLang reports.
    """
    names = names or {}
    vs = list(versions)
    known = [v for v in vs if v != INJECTED_VERSION]
    if not vs:
        return [{"version": current, "start": 0, "end": 0}] if current is not None else []
    last = known[0] if known else INJECTED_VERSION
    spans: list[dict[str, Any]] = []
    for i, v in enumerate(vs):
        v = last if v == INJECTED_VERSION else v
        last = v
        name = names.get(v, str(v))
        if spans and spans[-1]["version"] == name:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": name, "start": i, "end": i + 1})
    return spans


def finish_reason_json(c: Completion) -> dict[str, Any]:
    """SGLang's ``finish_reason`` dict (``FINISH_*.to_json`` in managers/schedule_batch.py) for ``c``."""
    n = len(c.token_ids)
    if c.finish_reason == "abort":
        return {"type": "abort", "message": str(c.meta.get("abort_message") or "Aborted"), "status_code": None,
                "err_type": None}
    if c.finish_reason == "length":
        return {"type": "length", "length": n}
    # "stop" and "interrupted" (stopped while answering after an interruption)
    return {"type": "stop", "matched": c.token_ids[-1] if c.token_ids else None}


def completion_to_sglang(c: Completion, *, rid: str, return_logprob: bool, weight_version: str, e2e: float,
                         tokenizer: Any = None, version_names: dict[int, str] | None = None,
                         return_text_in_logprobs: bool = False, return_prompt_token_ids: bool = False) -> dict:
    """One sample in SGLang's ``/generate`` response shape, plus our extension fields.

    ``meta_info`` keys as SGLang's TokenizerManager builds them (managers/tokenizer_manager.py): ``id``,
    ``finish_reason``, ``prompt_tokens``, ``weight_version``, ``completion_tokens``, ``cached_tokens``,
    ``e2e_latency``, ``weight_versions`` (0.5.19+) and, with ``return_logprob``, ``output_token_logprobs``
    as ``[logprob, token_id, text-or-null]``.
    """
    n = len(c.token_ids)
    text = ""
    if tokenizer is not None:
        try:
            text = tokenizer.decode(c.token_ids)
        except ValueError:
            text = ""
    meta: dict[str, Any] = {
        "id": rid, "finish_reason": finish_reason_json(c), "prompt_tokens": len(c.prompt_ids),
        "weight_version": weight_version, "completion_tokens": n, "cached_tokens": 0, "e2e_latency": e2e,
    }
    if return_logprob:
        def tok_text(t: int) -> str | None:
            if not (return_text_in_logprobs and tokenizer is not None):
                return None
            try:
                return tokenizer.decode([t])
            except ValueError:
                return None

        meta["output_token_logprobs"] = [[float(lp), int(t), tok_text(int(t))]
                                         for lp, t in zip(c.logprobs, c.token_ids)]
    meta["weight_versions"] = weight_version_spans(list(c.versions), version_names, weight_version)
    meta.update({
        ws.OUTPUT_TOKEN_VERSIONS: list(c.versions), ws.OUTPUT_TOKEN_INJECTED: list(c.injected),
        ws.THINK_BUDGET: c.think_budget, ws.TRUNCATED: bool(c.truncated), ws.FINISH_REASON: c.finish_reason,
    })
    out: dict[str, Any] = {"text": text, "output_ids": list(c.token_ids), "meta_info": meta}
    if return_prompt_token_ids:
        out["prompt_token_ids"] = list(c.prompt_ids)
    return out
