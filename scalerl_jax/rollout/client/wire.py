"""SGLang's native HTTP API as :mod:`scalerl_jax.rollout.client.sglang` speaks it to every release: the request
bodies it sends, the ``/generate`` responses it reads, and what a server is (release, capabilities, devices). Pure
functions over JSON; the HTTP calls, retries, failover and weight updates are the client's.

Requests (:func:`generate_payload`): SGLang's ``GenerateReqInput`` and ``SamplingParams`` field names, always
``return_logprob``; our extension ``length_control`` only when the request carries one (real SGLang does not
know it, ``sglang-router`` drops it).

Stop tokens: the protocol's ``stop_token_ids`` are the whole stop set. Real SGLang also stops at the model's
EOS unless ``ignore_eos``, which disables ``stop_token_ids`` too; so a request without stop ids is sent with
``ignore_eos: true`` (generate to ``max_new_tokens``, like the embedded engine), and one with stop ids stops at
them and at EOS (include EOS in them, as the trainer does, for identical behaviour on every back-end).

Responses, read the same way from every release (:func:`parse_sample`):

- tokens and log-probs come from ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` triples):
  ``output_ids`` is absent in 0.4.x and holds a few prompt tokens too in 0.5.3, so it is only cross-checked;
- per-token versions: our extension ``output_token_versions`` when present; else SGLang 0.5.19+'s
  ``meta_info.weight_versions`` spans; else every token gets the version the client knew the serving worker to
  hold when the attempt was submitted (behind a router: the oldest any worker holds), or the server's
  ``weight_version`` if that is older: never a newer one, so staleness is never under-counted;
- a response that does not parse (no log-probs, a null or non-finite log-prob, fewer log-probs than
  ``meta_info.completion_tokens``, wrong count of samples) is a failed attempt (:class:`BadResponse`, naming
  the field and the position) and is retried: a missing log-prob is never read as 0.

Servers (:class:`ServerCaps`, from ``/get_server_info``): ours lists ``scalerl_extensions`` (or reports version
``scalerl_jax``); a real SGLang's ``version`` is parsed into a release (:func:`parse_release`), which decides the
weight-update bodies: 0.5.6+ (and ours, and unknown) take ``/pause_generation {"mode"}`` and
``/update_weights_from_disk`` ``flush_cache`` (``false`` when pausing in place, which SGLang 0.5.23 requires while
requests are paused), older releases neither: their pause aborts what is in flight. Accelerator devices: ours
reports ``device_count``, real SGLang ``tp_size * pp_size * dp_size`` (:func:`devices_from_server_info`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from scalerl_jax.rollout import wire_schema as ws
from scalerl_jax.rollout.protocol import Completion, GenerationRequest, LengthControl, SamplingParams
from scalerl_jax.rollout.wire_schema import PAUSE_MODES, devices_from_server_info

__all__ = ["PAUSE_MODES", "PAUSE_MODE_RELEASE", "BadResponse", "Sample", "ServerCaps", "devices_from_server_info",
           "generate_payload", "length_payload", "parse_release", "parse_sample", "parse_version",
           "response_outputs", "sampling_payload"]

_SGLANG_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
# First SGLang release whose /pause_generation takes {"mode"} and whose UpdateWeightFromDiskReqInput has
# flush_cache (managers/io_struct.py: absent in 0.5.5.post3, present in 0.5.6)
PAUSE_MODE_RELEASE = (0, 5, 6)


class BadResponse(ValueError):
    """A ``/generate`` response without what the client needs (the attempt failed and is retried)."""


def parse_version(v: Any, default: int) -> int:
    """SGLang's ``weight_version`` is a string (``"default"`` until set); ours are integers."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def parse_release(v: Any) -> tuple[int, int, int] | None:
    """``"0.5.3.post1"`` -> ``(0, 5, 3)``; None for anything that is not an SGLang release string."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)\.(\d+)", v) if isinstance(v, str) else None
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def sampling_payload(p: SamplingParams, n: int | None = None, max_new_tokens: int | None = None) -> dict[str, Any]:
    """SGLang ``sampling_params`` for ``p`` (field names as in SGLang's SamplingParams)."""
    out: dict[str, Any] = {
        "temperature": float(p.temperature), "top_p": float(p.top_p),
        "max_new_tokens": int(p.max_new_tokens if max_new_tokens is None else max_new_tokens),
        "n": int(p.n if n is None else n),
    }
    if p.stop_token_ids:
        out["stop_token_ids"] = [int(t) for t in p.stop_token_ids]
    else:
        out["ignore_eos"] = True  # no stop set: generate to max_new_tokens, as the embedded engine does
    return out


def length_payload(lc: LengthControl) -> dict[str, Any]:
    """Our extension field ``length_control`` (unknown to real SGLang; dropped by ``sglang-router``)."""
    return {f: list(v) if isinstance(v, tuple) else int(v) for f in ws.LENGTH_FIELDS for v in [getattr(lc, f)]}


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
        body[ws.LENGTH_CONTROL] = length_payload(length)
    return body


@dataclass
class ServerCaps:
    """What a server (not a router) is and can do, from its ``/get_server_info`` (or ``/server_info``)."""

    url: str
    ours: bool = False  # our scalerl_jax server (it lists scalerl_extensions)
    version: str | None = None  # the "version" it reports
    release: tuple[int, int, int] | None = None  # parsed SGLang release; None for ours or unknown
    devices: int | None = None  # accelerator devices it computes on
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def pause_modes(self) -> bool:
        """``/pause_generation`` takes ``mode`` (and keeps in-flight requests in place); unknown: assume so."""
        return self.ours or self.release is None or self.release >= PAUSE_MODE_RELEASE

    @property
    def update_flush_field(self) -> bool:
        """``/update_weights_from_disk`` has ``flush_cache`` (default true from 0.5.6)."""
        return self.ours or self.release is None or self.release >= PAUSE_MODE_RELEASE

    @classmethod
    def from_info(cls, url: str, info: Any) -> Self:
        """The capabilities of the server at ``url`` that answered ``info`` to ``/get_server_info``."""
        info = info if isinstance(info, dict) else {}
        version = info.get("version") if isinstance(info.get("version"), str) else None
        ours = ws.EXTENSIONS_KEY in info or version == ws.SERVER_VERSION
        return cls(url, ours=ours, version=version, release=None if ours else parse_release(version),
                   devices=devices_from_server_info(info), info=info)

    def update_bodies(self, path: str, version: int, pause_mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``/pause_generation`` and ``/update_weights_from_disk`` bodies for this server, pausing in
        ``pause_mode``."""
        pause: dict[str, Any] = {"mode": pause_mode} if self.pause_modes else {}
        update: dict[str, Any] = {"model_path": str(path), "weight_version": str(version)}
        if self.update_flush_field:
            # in place, running requests keep their KV cache: SGLang 0.5.23 refuses to flush then
            update["flush_cache"] = pause_mode != "in_place"
        return pause, update


@dataclass
class Sample:
    """One parsed sample of a ``/generate`` response."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    injected: list[bool]
    finish: str
    truncated: bool
    think_budget: int | None
    has_extensions: bool
    output_ids_mismatch: bool = False  # ``output_ids`` disagreed with the log-prob ids (0.5.3 prefixes prompt ids)

    def to_completion(self, rid: str, j: int, req: GenerationRequest) -> Completion:
        """Sample ``j`` of request ``req`` (answered under ``rid``) as a protocol :class:`Completion`."""
        return Completion(
            request_id=rid, sample_index=j, prompt_ids=list(req.prompt_ids), token_ids=self.token_ids,
            logprobs=self.logprobs, versions=self.versions, injected=self.injected,
            finish_reason=self.finish,  # type: ignore[arg-type]
            truncated=self.truncated, think_budget=self.think_budget, meta=dict(req.meta),
        )


def response_outputs(out: Any, n: int) -> list[dict[str, Any]]:
    """The objects of a ``/generate`` response for ``n`` samples (one object, or a list), each with ``meta_info``;
    raises :class:`BadResponse` for any other count or shape."""
    outs = out if isinstance(out, list) else [out]
    if len(outs) != n or not all(isinstance(o, dict) and isinstance(o.get("meta_info"), dict) for o in outs):
        raise BadResponse(f"expected {n} outputs with meta_info, got {str(out)[:200]}")
    return outs


def parse_sample(o: dict[str, Any], v_submit: int) -> Sample:
    """One response object -> :class:`Sample`; ``v_submit`` is the version the client knew the serving worker to
    hold when the attempt was submitted (raises :class:`BadResponse` when it does not have what we need)."""
    meta = o["meta_info"]
    ids, logprobs = _tokens_and_logprobs(meta)
    oi = o.get("output_ids")
    # 0.5.3 puts a few prompt tokens in front (the detokenizer's decode_ids): the log-prob ids are right
    mismatch = isinstance(oi, list) and oi != ids
    n = len(ids)
    ext = meta.get(ws.OUTPUT_TOKEN_VERSIONS)
    if isinstance(ext, list) and len(ext) == n:
        versions = [int(v) for v in ext]
    else:
        # a version that is not an integer ("default") means weights this trainer never pushed: the base
        # model, version 0, whatever the trainer's version is (e.g. a server restarted outside the run)
        versions = _versions_from_spans(meta.get("weight_versions"), n, 0)
        if versions is None:
            # only the server's version when the response was built is known: it may be newer than the
            # tokens, so use the version at submit time (or the server's, if older: a stale server); a
            # release that reports no version at all gets the submit-time one
            wv = meta.get("weight_version")
            versions = [v_submit if wv is None else min(v_submit, parse_version(wv, 0))] * n
    inj = meta.get(ws.OUTPUT_TOKEN_INJECTED)
    injected = [bool(b) for b in inj] if isinstance(inj, list) and len(inj) == n else [False] * n
    fr = meta.get("finish_reason")
    ftype = fr.get("type") if isinstance(fr, dict) else fr if isinstance(fr, str) else None
    finish = meta.get(ws.FINISH_REASON) or _SGLANG_FINISH.get(ftype or "", "stop")
    return Sample(ids, logprobs, versions, injected, finish, bool(meta.get(ws.TRUNCATED, finish == "length")),
                  meta.get(ws.THINK_BUDGET), ws.THINK_BUDGET in meta, mismatch)


def _tokens_and_logprobs(meta: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Token ids and log-probs from ``meta_info.output_token_logprobs``; raises :class:`BadResponse`, naming the
    field and the position, for an entry without a finite log-prob or an integer id, and for a list shorter than
    the output (``meta_info.completion_tokens``). A missing log-prob is never read as 0 (p = 1): that would bias
    the importance ratio of every trained token."""
    lps = meta.get("output_token_logprobs")
    if not isinstance(lps, list):
        raise BadResponse(f"meta_info.output_token_logprobs missing or not a list: {str(lps)[:200]}")
    ids: list[int] = []
    logprobs: list[float] = []
    for i, t in enumerate(lps):
        if not isinstance(t, (list, tuple)) or len(t) < 2:
            raise BadResponse(f"meta_info.output_token_logprobs[{i}] is not [logprob, token_id, text]: {str(t)[:100]}")
        lp, tok = t[0], t[1]
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
            raise BadResponse(f"meta_info.output_token_logprobs[{i}][0] (the log-prob of output token {i}) is "
                              f"{json.dumps(lp) if lp is None else repr(lp)}, not a finite number")
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise BadResponse(f"meta_info.output_token_logprobs[{i}][1] (the id of output token {i}) is "
                              f"{json.dumps(tok) if tok is None else repr(tok)}, not a token id")
        logprobs.append(float(lp))
        ids.append(tok)
    n_out = meta.get("completion_tokens")
    if isinstance(n_out, int) and not isinstance(n_out, bool) and n_out > len(ids):
        raise BadResponse(f"meta_info.output_token_logprobs has {len(ids)} entries for {n_out} output tokens "
                          f"(meta_info.completion_tokens): no log-prob from position {len(ids)} on")
    return ids, logprobs


def _versions_from_spans(spans: Any, n: int, default: int) -> list[int] | None:
    """SGLang 0.5.19+'s ``meta_info.weight_versions`` (``[{version, start, end}]``, end exclusive) -> one version
    per output token; None when absent or not covering the tokens. A span whose version is not an integer
    string (``"default"``: before any update) gets ``default``."""
    if not isinstance(spans, list) or not spans or n == 0:
        return None
    out: list[int | None] = [None] * n
    try:
        for s in spans:
            v = parse_version(s["version"], default)
            for i in range(max(0, int(s["start"])), min(n, int(s["end"]))):
                out[i] = v
    except (KeyError, TypeError, ValueError):
        return None
    if any(v is None for v in out):
        return None
    return [int(v) for v in out if v is not None]
