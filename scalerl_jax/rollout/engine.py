"""Embedded JAX generation engine: continuous batching over a slot KV cache, chunked decode, in-flight weight
updates, interruption length control.

Scheduler (continuous batching). The engine owns ``B`` row *slots* (a power-of-two bucket, at least 8, at most
``max_batch``), one KV cache ``{"k", "v"}: [L, B, K, S, Dh]`` and per-slot constants (sampling parameters,
length control, a PRNG key) and decode state, mirrored on the host between chunks. Work enters through
:meth:`JaxEngine.submit`, from any thread: requests are validated, expanded into their ``n`` rows (samples),
thinking budgets and per-row sampling keys are drawn, and the rows queue FIFO. Work is done by
:meth:`JaxEngine.step`, one scheduler iteration on the calling thread (one thread at a time):

1. Install weights that arrived through :meth:`JaxEngine.update_weights`.
2. Admit waiting rows into free slots. B first grows to the bucket of running + waiting rows (up to
   ``max_batch``; beyond it rows wait for slots to free up) and the cache length S to the bucket of the
   longest ``prompt + max_new_tokens`` (both by zero padding; the jitted functions then see a new static
   shape). Only the new rows are prefilled (:func:`forward_cached` over the prompt minus its last token,
   right padded to a power-of-two length bucket, rows padded to a power-of-four bucket; compiled per those two
   buckets only) and their K/V scattered into their slots.
   The last prompt token becomes the row's *pending* token.
3. Decode one chunk: one jitted call runs ``decode_chunk`` steps under ``lax.scan`` over all B slots. A step
   feeds each row's pending token at its own position (writing its K/V into the cache), takes float32 logits
   from the FP32 head (:func:`lm_logits`), chooses the next token and advances a per-row state machine
   (below). Finished and empty slots keep running (static shapes) but emit nothing.
4. Harvest: the chunk's tokens go to per-slot host buffers; finished rows become Completions and free their
   slots; a submission whose rows are all done completes (its ``on_done`` callback runs on this thread).
5. Call ``chunk_hook(chunk_index)`` (the index counts chunks since the engine was last idle).

When no row is left the cache is dropped and B and S start again from the smallest bucket. Slots are reused
without clearing: a new row's prefill overwrites its prompt positions and every later position is written by
the decode step that feeds it before any query can attend to it.

:meth:`JaxEngine.generate` (blocking; the trainer's in-process path) is ``submit`` followed by ``step`` until
that submission is done: the same scheduler, so requests submitted from other threads meanwhile share the
batch. A server instead runs one driver thread that calls ``step`` while :meth:`JaxEngine.has_work` (see
:class:`scalerl_jax.rollout.server.EngineDriver`): requests arriving while a batch runs join it at the next
chunk boundary. :meth:`JaxEngine.abort` finishes every row submitted so far with finish reason "abort" at the
next chunk boundary; running rows keep the tokens they already generated.

Weights and versions: rows keep their KV cache across a swap (PipelineRL's in-flight update, RECIPE.md
section 3), so after a swap the cache mixes keys/values of both versions. A token records the version of the
params whose logits it was drawn from, i.e. the params of the decode chunk that produced it; a row admitted
after a swap is prefilled with the then-current params. For a row that ran ``m`` chunks (chunk size C,
prompt length P) before a swap, the positions < P-1+mC were fed by the old params and completion tokens
``mC..`` carry the new version.

Sampling and determinism: a row's sampling key is its submission's key (split from the engine's key) folded
with the row's index in the submission and then with its token index, so a row's samples do not depend on its
slot or on the other rows in the batch, and the same submissions in the same order with the same seed give the
same outputs. :meth:`JaxEngine.reseed` resets the key and the NumPy RNG that draws thinking budgets.

Log-probs (see :mod:`scalerl_jax.rollout.sampling`): ``log_softmax(logits / temperature)`` of the chosen
token, before top-p truncation (for temperature 0: ``log_softmax(logits)``), i.e. exactly what the trainer
recomputes with ``token_logprobs(..., temperature=temperature)``. Injected tokens record 0.0.

Interruption length control (RECIPE.md section 4), per row, inside the jitted loop:

    THINK  --(n_generated == think_budget, think_end not seen)-->  INJECT  --(all interruption ids fed)-->
    ANSWER --(stop token: "interrupted" | answer_budget sampled tokens: "length", truncated)
    THINK  --(think_end_ids just completed)-->  FREE (plain generation: "stop" or "length")

In INJECT the token is forced to ``interruption_ids[i]`` (flagged injected, version INJECTED_VERSION, logprob
0.0) and still fed through the model, so the answer is conditioned on it. Because the state machine runs per
step, the interruption lands exactly at the budget whatever the chunk size. ``max_new_tokens`` caps every
completion (injected tokens included); with length control it must be at least
``budget_hi + len(interruption_ids) + answer_budget``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.llama import (
    Params,
    _dt,
    _embed,
    forward_cached,
    init_cache,
    lm_logits,
    param_shapes,
    rms_norm,
    rope_inv_freq,
)
from scalerl_jax.rollout.protocol import INJECTED_VERSION, Completion, GenerationRequest, LengthControl
from scalerl_jax.rollout.sampling import sample_tokens

PH_THINK, PH_INJECT, PH_ANSWER, PH_FREE = 0, 1, 2, 3
FIN_NONE, FIN_STOP, FIN_LENGTH, FIN_INTERRUPTED = 0, 1, 2, 3
_FINISH_NAMES = {FIN_STOP: "stop", FIN_LENGTH: "length", FIN_INTERRUPTED: "interrupted"}
_NO_BUDGET = 2**30

log = logging.getLogger(__name__)


def _pow2_at_least(n: int, minimum: int = 1) -> int:
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


# ---- jitted pieces ------------------------------------------------------------------------------------


def _prefill_kv(params: Params, tokens_kT: jax.Array, *, cfg: ModelConfig):
    """K/V of new rows ``tokens_kT`` (positions 0..T-1) in the decode layout ``{"k", "v"}: [L, k, K, T, Dh]``.

    Runs :func:`forward_cached` on a cache of exactly T positions (cheap cache writes). Compiled per (k, T) only,
    not per slot-cache shape: the expensive compile is shared by every batch and cache size.
    """
    k, T = tokens_kT.shape
    pos_kT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (k, T))
    _, new = forward_cached(params, tokens_kT, pos_kT, init_cache(cfg, k, T), cfg)
    return {n: jnp.swapaxes(new[n], 2, 3) for n in ("k", "v")}


def _scatter_rows(cache, new, slot_k: jax.Array):
    """Write new rows' K/V ``[L, k, K, T, Dh]`` into slots ``slot_k`` of the slot cache ``[L, B, K, S, Dh]``,
    positions 0..T-1; a slot index >= B (bucket padding) is dropped. The slot's positions >= T keep whatever an
    earlier row left there: decode overwrites each of them before any query can see it."""
    T = new["k"].shape[3]
    return {n: cache[n].at[:, slot_k, :, :T].set(new[n].astype(cache[n].dtype), mode="drop") for n in ("k", "v")}


def _rope_1(x_BHD: jax.Array, cos_BD: jax.Array, sin_BD: jax.Array) -> jax.Array:
    """Rotate-half RoPE for one position per row (same convention as :func:`llama.apply_rope`)."""
    x = x_BHD.astype(jnp.float32)
    half = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return (x * cos_BD[:, None] + rot * sin_BD[:, None]).astype(x_BHD.dtype)


def _decode_forward(params: Params, tok_B: jax.Array, pos_B: jax.Array, cache, cfg: ModelConfig):
    """Single-token forward for decode: feed ``tok_B`` at ``pos_B``, return (final-norm hidden [B, D], cache).

    Same math as :func:`llama.forward_cached` with T = 1, but specialised for CPU/GPU decode speed: the cache is
    laid out [L, B, K, S, Dh] (attention is then a plain batched matmul over (B, K)), it travels in the
    layer-scan carry so the new K/V is scattered in place, and RoPE angles are computed once per step.
    """
    if cfg.arch != "llama":  # the generic path (Llama-4 MoE): forward_cached with T = 1 in its own cache layout
        c = {n: jnp.swapaxes(cache[n], 2, 3) for n in ("k", "v")}
        h, c = forward_cached(params, tok_B[:, None], pos_B[:, None], c, cfg)
        return h[:, 0], {n: jnp.swapaxes(c[n], 2, 3) for n in ("k", "v")}
    dt = _dt(cfg.dtype)
    B = tok_B.shape[0]
    S = cache["k"].shape[3]
    K, Dh = cfg.n_kv_heads, cfg.head_dim
    G = cfg.n_heads // K
    ang_BF = pos_B.astype(jnp.float32)[:, None] * jnp.asarray(rope_inv_freq(cfg))
    cos_BD = jnp.cos(jnp.concatenate([ang_BF, ang_BF], -1))
    sin_BD = jnp.sin(jnp.concatenate([ang_BF, ang_BF], -1))
    mask_BS = jnp.arange(S)[None, :] <= pos_B[:, None]
    b_idx = jnp.arange(B)[:, None]
    k_idx = jnp.arange(K)[None, :]
    scale = 1.0 / math.sqrt(Dh)

    def body(carry, xs):
        x_BD, ck, cv = carry
        lp, layer = xs
        h = rms_norm(x_BD, lp["attn_norm"], cfg.rms_eps)
        q_BHD = _rope_1(jnp.einsum("bd,dhk->bhk", h, lp["wq"].astype(dt)), cos_BD, sin_BD)
        k_BKD = _rope_1(jnp.einsum("bd,dhk->bhk", h, lp["wk"].astype(dt)), cos_BD, sin_BD)
        v_BKD = jnp.einsum("bd,dhk->bhk", h, lp["wv"].astype(dt))
        ck = ck.at[layer, b_idx, k_idx, pos_B[:, None]].set(k_BKD.astype(ck.dtype))
        cv = cv.at[layer, b_idx, k_idx, pos_B[:, None]].set(v_BKD.astype(cv.dtype))
        q_BKGD = q_BHD.reshape(B, K, G, Dh)
        s_BKGS = jnp.einsum("bkgd,bksd->bkgs", q_BKGD, ck[layer].astype(dt), preferred_element_type=jnp.float32)
        s_BKGS = jnp.where(mask_BS[:, None, None], s_BKGS * scale, jnp.finfo(jnp.float32).min)
        p_BKGS = jax.nn.softmax(s_BKGS, axis=-1).astype(dt)
        o_BHD = jnp.einsum("bkgs,bksd->bkgd", p_BKGS, cv[layer].astype(dt)).reshape(B, K * G, Dh)
        x_BD = x_BD + jnp.einsum("bhk,hkd->bd", o_BHD, lp["wo"].astype(dt))
        h = rms_norm(x_BD, lp["mlp_norm"], cfg.rms_eps)
        g = jnp.einsum("bd,df->bf", h, lp["w_gate"].astype(dt))
        u = jnp.einsum("bd,df->bf", h, lp["w_up"].astype(dt))
        x_BD = x_BD + jnp.einsum("bf,fd->bd", jax.nn.silu(g) * u, lp["w_down"].astype(dt))
        return (x_BD, ck, cv), None

    x_BD = _embed(params, tok_B[:, None], cfg)[:, 0]
    layers = jnp.arange(cfg.n_layers)
    (x_BD, ck, cv), _ = jax.lax.scan(body, (x_BD, cache["k"], cache["v"]), (params["layers"], layers))
    return rms_norm(x_BD, params["final_norm"], cfg.rms_eps), {"k": ck, "v": cv}


def _decode_step(params, cache, st: dict, rows: dict, key, *, cfg: ModelConfig, use_top_p: bool):
    """One token for every row: feed the pending token, choose the next, advance the state machine."""
    hidden_BD, cache = _decode_forward(params, st["tok"], st["pos"], cache, cfg)
    logits_BV = lm_logits(params, hidden_BD, cfg)
    samp_B, samp_lp_B = sample_tokens(logits_BV, rows["temp"], rows["top_p"], key, use_top_p=use_top_p)

    active_B = ~st["done"]
    phase_B = st["phase"]
    inj_B = phase_B == PH_INJECT
    n_inter = rows["inter_ids"].shape[1]
    inj_idx_B = jnp.clip(st["inj_idx"], 0, n_inter - 1)
    forced_B = jnp.take_along_axis(rows["inter_ids"], inj_idx_B[:, None], axis=1)[:, 0]
    tok_B = jnp.where(inj_B, forced_B, samp_B)
    lp_B = jnp.where(inj_B, 0.0, samp_lp_B)

    n_gen_B = st["n_gen"] + active_B
    inj_idx_new_B = st["inj_idx"] + (active_B & inj_B)
    inj_finished_B = active_B & inj_B & (inj_idx_new_B >= rows["inter_len"])
    ans_B = st["ans"] + (active_B & (phase_B == PH_ANSWER))

    thinking_B = active_B & (phase_B == PH_THINK)
    shifted_BW = jnp.concatenate([st["window"][:, 1:], tok_B[:, None]], axis=1)
    window_BW = jnp.where(thinking_B[:, None], shifted_BW, st["window"])
    matches_B = jnp.all((window_BW == rows["think_end"]) | ~rows["think_mask"], axis=1)
    think_end_hit_B = thinking_B & matches_B

    is_stop_B = active_B & ~inj_B & jnp.any(tok_B[:, None] == rows["stop"], axis=1)
    budget_hit_B = thinking_B & ~think_end_hit_B & ~is_stop_B & (n_gen_B >= rows["budget"])
    new_phase_B = jnp.where(think_end_hit_B, PH_FREE, phase_B)
    new_phase_B = jnp.where(budget_hit_B, PH_INJECT, new_phase_B)
    new_phase_B = jnp.where(inj_finished_B, PH_ANSWER, new_phase_B)
    answer_full_B = (new_phase_B == PH_ANSWER) & (ans_B >= rows["ans_budget"])
    len_hit_B = active_B & ~is_stop_B & (answer_full_B | (n_gen_B >= rows["max_new"]))

    finish_B = st["finish"]
    finish_B = jnp.where(is_stop_B, jnp.where(phase_B == PH_ANSWER, FIN_INTERRUPTED, FIN_STOP), finish_B)
    finish_B = jnp.where(len_hit_B, FIN_LENGTH, finish_B)
    new_st = {
        "tok": jnp.where(active_B, tok_B, st["tok"]),
        "pos": st["pos"] + active_B,
        "n_gen": n_gen_B,
        "done": st["done"] | is_stop_B | len_hit_B,
        "phase": new_phase_B,
        "inj_idx": inj_idx_new_B,
        "ans": ans_B,
        "window": window_BW,
        "finish": finish_B,
    }
    return cache, new_st, (tok_B, lp_B, active_B, active_B & inj_B)


def _decode_chunk(params, cache, st, rows, *, cfg: ModelConfig, n_steps: int, use_top_p: bool):
    """``n_steps`` decode steps in one ``lax.scan``; returns (cache, state, per-step outputs [n_steps, B]).

    Row b's sampling key at a step is its submission's key folded with the row's index in the submission and
    then with its token index, so its noise does not depend on its slot, on the other rows or on chunk
    boundaries.
    """

    def body(carry, _):
        cache, st = carry
        keys_B2 = jax.vmap(lambda k, r, n: jax.random.fold_in(jax.random.fold_in(k, r), n))(
            rows["key"], rows["row_idx"], st["n_gen"])
        cache, st, ys = _decode_step(params, cache, st, rows, keys_B2, cfg=cfg, use_top_p=use_top_p)
        return (cache, st), ys

    (cache, st), ys = jax.lax.scan(body, (cache, st), None, length=n_steps)
    return cache, st, ys


# Module-level jits (the config is a static, hashable argument): engines over the same config share compiled code.
_prefill_kv_jit = jax.jit(_prefill_kv, static_argnames=("cfg",))
_scatter_rows_jit = jax.jit(_scatter_rows, donate_argnums=(0,))
_decode_chunk_jit = jax.jit(_decode_chunk, static_argnames=("cfg", "n_steps", "use_top_p"), donate_argnums=(1, 2))


# ---- host side ---------------------------------------------------------------------------------------


_RIGHT_ALIGNED = ("think_end", "think_mask", "window")  # matched against the newest tokens: padding goes left


def _empty_slots(B: int, stop_w: int, win_w: int, inter_w: int) -> tuple[dict, dict]:
    """Host constants and decode state of B empty slots (done: they emit nothing)."""
    consts = {
        "temp": np.zeros(B, np.float32), "top_p": np.ones(B, np.float32), "max_new": np.zeros(B, np.int32),
        "stop": np.full((B, stop_w), -1, np.int32), "budget": np.full(B, _NO_BUDGET, np.int32),
        "inter_ids": np.zeros((B, inter_w), np.int32), "inter_len": np.ones(B, np.int32),
        "ans_budget": np.zeros(B, np.int32), "think_end": np.full((B, win_w), -1, np.int32),
        "think_mask": np.zeros((B, win_w), bool), "key": np.zeros((B, 2), np.uint32),
        "row_idx": np.zeros(B, np.int32),
    }
    st = {
        "tok": np.zeros(B, np.int32), "pos": np.zeros(B, np.int32), "n_gen": np.zeros(B, np.int32),
        "done": np.ones(B, bool), "phase": np.full(B, PH_FREE, np.int32), "inj_idx": np.zeros(B, np.int32),
        "ans": np.zeros(B, np.int32), "window": np.full((B, win_w), -1, np.int32),
        "finish": np.full(B, FIN_LENGTH, np.int32),
    }
    return consts, st


def _copy_slots(new: dict, old: dict) -> None:
    """Copy ``old`` slot arrays into the (larger) ``new`` ones, keeping right-aligned windows right-aligned."""
    for k, a in old.items():
        if a.ndim == 1:
            new[k][: a.shape[0]] = a
        elif k in _RIGHT_ALIGNED:
            new[k][: a.shape[0], new[k].shape[1] - a.shape[1]:] = a
        else:
            new[k][: a.shape[0], : a.shape[1]] = a


class Submission:
    """Handle of one :meth:`JaxEngine.submit` call; done once every row (``n`` per request) has finished.

    ``results[i][j]`` is request i's sample j. ``on_done(submission)`` runs once, on the thread that finished
    the last row (the stepping thread, or the one calling :meth:`JaxEngine.abort`). ``error`` is set when the
    engine failed; :meth:`wait` then raises it.
    """

    def __init__(self, requests: list[GenerationRequest], on_done: Callable[[Submission], None] | None, seq: int):
        self.requests = requests
        self.seq = seq
        self.t_submit = time.time()
        self.results: list[list[Completion]] = [[None] * r.params.n for r in requests]  # type: ignore[list-item]
        self.error: BaseException | None = None
        self._left = sum(r.params.n for r in requests)
        self._on_done = on_done
        self._event = threading.Event()

    def done(self) -> bool:
        """Whether every row has finished (or the engine failed)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> list[list[Completion]]:
        """Block until done; ``n`` completions per request, in request order (raises the engine's error)."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"submission {self.seq} not done after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.results

    def _add(self, row: _Row, comp: Completion) -> list[Submission]:
        self.results[row.req_idx][row.sample_idx] = comp
        self._left -= 1
        return [self] if self._left == 0 else []

    def _finish(self) -> None:
        if self._event.is_set():
            return
        self._event.set()
        if self._on_done is not None:
            try:
                self._on_done(self)
            except Exception:  # a caller's callback must not take the scheduler down
                log.exception("on_done callback of submission %d failed", self.seq)


@dataclass
class _Row:
    sub: Submission
    req_idx: int
    sample_idx: int
    prompt: list[int]
    temperature: float
    top_p: float
    max_new: int
    stop: tuple[int, ...]
    length: LengthControl | None
    budget: int | None
    key: np.ndarray  # uint32[2]: the submission's sampling key ...
    row_idx: int  # ... folded with this (the row's index in the submission)
    t_start: float = 0.0


def _fill_slot(consts: dict, st: dict, b: int, r: _Row) -> None:
    """Write row ``r``'s constants and initial decode state into slot ``b`` (every field: slots are reused)."""
    W = consts["think_end"].shape[1]
    consts["temp"][b], consts["top_p"][b], consts["max_new"][b] = r.temperature, r.top_p, r.max_new
    consts["stop"][b] = -1
    consts["stop"][b, : len(r.stop)] = r.stop
    consts["key"][b], consts["row_idx"][b] = r.key, r.row_idx
    consts["budget"][b], consts["ans_budget"][b], consts["inter_len"][b] = _NO_BUDGET, 0, 1
    consts["inter_ids"][b], consts["think_end"][b], consts["think_mask"][b] = 0, -1, False
    st["tok"][b], st["pos"][b], st["n_gen"][b] = r.prompt[-1], len(r.prompt) - 1, 0
    st["done"][b], st["finish"][b], st["phase"][b] = False, FIN_NONE, PH_FREE
    st["inj_idx"][b], st["ans"][b], st["window"][b] = 0, 0, -1
    if r.length is not None:
        lc = r.length
        consts["budget"][b], consts["ans_budget"][b] = r.budget, lc.answer_budget
        consts["inter_ids"][b, : len(lc.interruption_ids)] = lc.interruption_ids
        consts["inter_len"][b] = len(lc.interruption_ids)
        consts["think_end"][b, W - len(lc.think_end_ids):] = lc.think_end_ids
        consts["think_mask"][b, W - len(lc.think_end_ids):] = True
        st["phase"][b] = PH_THINK


class JaxEngine:
    """In-process :class:`~scalerl_jax.rollout.protocol.Generator` over the functional Llama, with continuous
    batching (see the module docstring).

    Args:
      model_cfg: the model's :class:`ModelConfig`.
      params: params pytree (our layout; NumPy or JAX arrays).
      max_batch: most rows (samples) decoded together; further rows wait for a free slot.
      max_len: KV-cache slots per row; every request needs ``len(prompt) + max_new_tokens <= max_len``.
      decode_chunk: decode steps per jitted call (rows join and leave, weights change and the host harvests
        tokens only between chunks).
      seed: seeds both the sampling key and the NumPy RNG that draws thinking budgets.
      version: version tag of ``params``.

    Thread safety: ``submit``, ``update_weights``, ``abort``, ``reseed``, ``has_work`` and ``counters`` may be
    called from any thread at any time; ``step`` (and so ``generate``) from any thread, one at a time (others
    wait). ``chunk_hook`` (optional callable taking the chunk index) runs on the stepping thread after each
    decode chunk, after its finished rows were delivered and before pending weights are installed; tests use it
    to make a swap deterministic, the server parks in it to pause in place.
    """

    def __init__(self, model_cfg: ModelConfig, params: Params, *, max_batch: int, max_len: int,
                 decode_chunk: int = 8, seed: int = 0, version: int = 0):
        if max_batch < 1:
            raise ValueError(f"JaxEngine: max_batch must be >= 1, got {max_batch}")
        if max_len < 2:
            raise ValueError(f"JaxEngine: max_len must be >= 2, got {max_len}")
        if decode_chunk < 1:
            raise ValueError(f"JaxEngine: decode_chunk must be >= 1, got {decode_chunk}")
        self.cfg = model_cfg
        self.max_batch = int(max_batch)
        self.max_len = int(max_len)
        self.decode_chunk = int(decode_chunk)
        self.chunk_hook: Callable[[int], None] | None = None
        self._params = self._prepare_params(params)
        self._version = int(version)
        self._pending: tuple[Params, int] | None = None
        # _lock guards the weights, the waiting queue, the RNGs, the counters and the busy/abort bookkeeping; the
        # slot arrays belong to whoever holds _drive (re-entrant: abort() may be called from inside chunk_hook)
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._drive = threading.RLock()
        self._rng = np.random.default_rng(seed)
        self._key = jax.random.PRNGKey(seed)
        jax.random.split(self._key)  # compile it now, not on the first submit (a server's event loop)
        self._waiting: deque[_Row] = deque()
        self._seq = 0  # submissions so far
        self._abort_upto = 0  # abort() asked to finish every submission with seq <= this ...
        self._aborted_upto = 0  # ... and this far it has been done
        self._stepping = False
        self._n_running = 0  # rows in slots
        self._counters = {"decode_chunks": 0, "admitted_rows": 0, "admitted_mid_batch": 0, "max_running_rows": 0,
                          "completed_rows": 0, "aborted_rows": 0, "busy_periods": 0}
        self._prefill_fn = functools.partial(_prefill_kv_jit, cfg=model_cfg)
        self._decode_fn = functools.partial(_decode_chunk_jit, cfg=model_cfg)
        self._reset_slots()

    # ---- construction / weights ----

    @classmethod
    def from_hf(cls, path: str | os.PathLike, *, max_batch: int, max_len: int | None = None, **kwargs) -> JaxEngine:
        """Engine over an HF LlamaForCausalLM checkpoint directory (``max_len`` defaults to the config's)."""
        from scalerl_jax.models.hf_io import load_hf_checkpoint

        params, cfg = load_hf_checkpoint(path)
        return cls(cfg, params, max_batch=max_batch, max_len=max_len or cfg.max_seq_len, **kwargs)

    def _prepare_params(self, params: Params) -> Params:
        """Check the tree and shapes against the config; move to device in the config's param dtype."""
        want = param_shapes(self.cfg)
        dt = jnp.float32 if self.cfg.param_dtype == "float32" else jnp.bfloat16
        want_def = jax.tree.structure(want, is_leaf=lambda x: isinstance(x, tuple))
        got_def = jax.tree.structure(params)
        if want_def != got_def:
            raise ValueError(f"JaxEngine: params tree {got_def} does not match the model config's {want_def}")
        flat_w = jax.tree.leaves(want, is_leaf=lambda x: isinstance(x, tuple))
        flat_p, treedef = jax.tree.flatten(params)
        for shape, p in zip(flat_w, flat_p):
            if tuple(p.shape) != tuple(shape):
                raise ValueError(f"JaxEngine: a parameter has shape {tuple(p.shape)}, expected {tuple(shape)}")
        return jax.tree.unflatten(treedef, [jnp.asarray(p, dt) for p in flat_p])

    def update_weights(self, weights: Any, version: int) -> None:
        """Install new weights (params pytree, or an HF checkpoint directory path) tagged ``version``.

        Thread-safe. Rows in flight pick them up at the next decode-chunk boundary and keep their KV cache.
        """
        if isinstance(weights, (str, os.PathLike)):
            from scalerl_jax.models.hf_io import load_hf_checkpoint

            weights, cfg = load_hf_checkpoint(weights, param_dtype=self.cfg.param_dtype)
            if param_shapes(cfg) != param_shapes(self.cfg):
                raise ValueError(f"JaxEngine.update_weights: checkpoint shapes {param_shapes(cfg)} differ from the "
                                 f"engine's {param_shapes(self.cfg)}")
        prepared = self._prepare_params(weights)
        with self._lock:
            if self._stepping or self._n_running:
                self._pending = (prepared, int(version))
            else:
                self._params, self._version, self._pending = prepared, int(version), None

    @property
    def weight_version(self) -> int:
        """Version of the newest weights handed to the engine (installed or waiting for a chunk boundary)."""
        with self._lock:
            return self._pending[1] if self._pending is not None else self._version

    def _current(self) -> tuple[Params, int]:
        with self._lock:
            return self._install_pending()

    def _install_pending(self) -> tuple[Params, int]:
        if self._pending is not None:
            (self._params, self._version), self._pending = self._pending, None
        return self._params, self._version

    def reseed(self, seed: int) -> None:
        """Re-seed the sampling key and the NumPy RNG that draws thinking budgets (for submissions from now on)."""
        with self._lock:
            self._rng = np.random.default_rng(seed)
            self._key = jax.random.PRNGKey(seed)

    # ---- requests ----

    def _validate(self, requests: Sequence[GenerationRequest]) -> None:
        """ValueError naming the request on bad input."""
        V = self.cfg.vocab_size
        for i, req in enumerate(requests):
            name = f"request {i} (id {req.request_id!r})"
            prompt = [int(t) for t in req.prompt_ids]
            if not prompt:
                raise ValueError(f"{name}: prompt_ids is empty")
            bad = [t for t in prompt if not 0 <= t < V]
            if bad:
                raise ValueError(f"{name}: prompt token id {bad[0]} is outside the vocabulary [0, {V})")
            if len(prompt) > self.max_len:
                raise ValueError(f"{name}: prompt has {len(prompt)} tokens, longer than the engine's max_len "
                                 f"{self.max_len}")
            sp = req.params
            if len(prompt) + sp.max_new_tokens > self.max_len:
                raise ValueError(f"{name}: prompt length {len(prompt)} + max_new_tokens {sp.max_new_tokens} exceeds "
                                 f"the engine's max_len {self.max_len}")
            bad = [t for t in sp.stop_token_ids if not 0 <= t < V]
            if bad:
                raise ValueError(f"{name}: stop token id {bad[0]} is outside the vocabulary [0, {V})")
            lc = req.length
            if lc is not None:
                bad = [t for t in (*lc.think_end_ids, *lc.interruption_ids) if not 0 <= t < V]
                if bad:
                    raise ValueError(f"{name}: length-control token id {bad[0]} is outside the vocabulary [0, {V})")
                need = lc.budget_hi + len(lc.interruption_ids) + lc.answer_budget
                if sp.max_new_tokens < need:
                    raise ValueError(f"{name}: max_new_tokens {sp.max_new_tokens} is below budget_hi + "
                                     f"len(interruption_ids) + answer_budget = {need}")

    def _expand(self, sub: Submission) -> list[_Row]:
        """Rows of a validated submission: thinking budgets and sampling keys drawn in row order (under _lock)."""
        rows: list[_Row] = []
        if not sub.requests:
            return rows
        # one split per submission whatever its size (a split into n keys would compile once per distinct n)
        self._key, sub_key = jax.random.split(self._key)
        sub_key = np.asarray(sub_key, np.uint32)
        for i, req in enumerate(sub.requests):
            sp, lc = req.params, req.length
            prompt = [int(t) for t in req.prompt_ids]
            for s in range(sp.n):
                budget = int(self._rng.integers(lc.budget_lo, lc.budget_hi + 1)) if lc is not None else None
                rows.append(_Row(sub, i, s, prompt, float(sp.temperature), float(sp.top_p), int(sp.max_new_tokens),
                                 tuple(int(t) for t in sp.stop_token_ids), lc, budget, sub_key, len(rows)))
        return rows

    def submit(self, requests: Sequence[GenerationRequest],
               on_done: Callable[[Submission], None] | None = None) -> Submission:
        """Queue ``requests`` for generation and return at once (thread-safe); ValueError on a bad request.

        The rows join the running batch at the next decode-chunk boundary of whichever thread calls
        :meth:`step` (someone must: :meth:`drive` does it until this submission is done, a server's driver thread
        does it forever). ``on_done(submission)`` runs once all of them have finished.
        """
        requests = list(requests)
        self._validate(requests)
        with self._lock:
            self._seq += 1
            sub = Submission(requests, on_done, self._seq)
            rows = self._expand(sub)
            self._waiting.extend(rows)
        if not rows:
            sub._finish()
        return sub

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Blocking: ``n`` completions per request, in request order (``submit`` + ``drive``)."""
        return self.drive(self.submit(requests))

    def drive(self, sub: Submission) -> list[list[Completion]]:
        """Call :meth:`step` on this thread until ``sub`` is done; its results (raises the engine's error)."""
        while not sub.done():
            if not self.step():
                sub._event.wait(0.01)  # another thread holds our rows (its step delivers them)
        return sub.wait()

    def has_work(self) -> bool:
        """Whether :meth:`step` has rows to admit or decode (or an abort to carry out)."""
        with self._lock:
            return bool(self._waiting) or self._n_running > 0 or self._abort_upto > self._aborted_upto

    @property
    def running_rows(self) -> int:
        """Rows currently in slots."""
        with self._lock:
            return self._n_running

    def counters(self) -> dict[str, int]:
        """Scheduler counters (cumulative) and the current occupancy, e.g. to show continuous batching at work.

        ``admitted_mid_batch`` counts rows admitted while other rows were running; ``max_running_rows`` is the
        most rows ever decoded together; ``busy_periods`` counts runs of the scheduler from idle to idle.
        """
        with self._lock:
            return {**self._counters, "running_rows": self._n_running, "waiting_rows": len(self._waiting),
                    "batch_slots": self._B, "cache_len": self._S}

    def abort(self) -> None:
        """Finish every row submitted so far with finish reason "abort" (thread-safe); returns once done.

        Running rows keep the tokens they already generated (with their log-probs and versions); waiting rows
        finish empty. When no thread is stepping this happens at once on the calling thread; otherwise the
        stepping thread does it after its current chunk (and after ``chunk_hook`` returns).
        """
        with self._lock:
            target = self._abort_upto = self._seq
        while True:
            if self._drive.acquire(blocking=False):
                try:
                    if self._abort_wanted():
                        self._abort_rows()
                    self._maybe_idle()
                finally:
                    self._drive.release()
                return
            with self._lock:
                if self._aborted_upto >= target:
                    return
                self._cv.wait(0.01)

    def _abort_wanted(self) -> bool:
        with self._lock:
            return self._abort_upto > self._aborted_upto

    # ---- the scheduler (the slot arrays below are touched only by the thread holding _drive) ----

    def _batch_bucket(self, n: int) -> int:
        return min(self.max_batch, _pow2_at_least(n, 8))

    def _reset_slots(self) -> None:
        self._B = self._S = 0
        self._widths = (4, 4, 8)  # stop ids, think-end window, interruption ids (grown on demand)
        self._slots: list[_Row | None] = []
        self._cache: dict[str, jax.Array] | None = None
        self._consts: dict[str, np.ndarray] = {}
        self._st: dict[str, np.ndarray] = {}
        self._consts_dev: dict[str, jax.Array] = {}
        self._st_dev: dict[str, jax.Array] = {}
        self._dirty = True  # host slot arrays changed: upload them before the next chunk
        self._out: dict[str, np.ndarray] = {}  # per-slot output buffers [B, S]: tok, lp, ver, inj
        self._chunk_idx = 0

    def step(self) -> bool:
        """One scheduler iteration on the calling thread (see the module docstring); False if there was nothing
        to do.

        Concurrent callers take turns. An exception from the jitted code fails every submission in the engine
        (their ``wait`` raises it); one from ``chunk_hook`` aborts them (finish reason "abort", partial outputs
        kept). Both then propagate to the caller.
        """
        with self._drive:
            with self._lock:
                self._stepping = True
                params, version = self._install_pending()
            try:
                return self._step(params, version)
            finally:
                with self._lock:
                    self._stepping = False
                    if not self._n_running:
                        self._install_pending()  # weights that arrived after the last chunk: free the old ones

    def _step(self, params: Params, version: int) -> bool:
        did = False
        if self._abort_wanted():
            self._abort_rows()
            did = True
        try:
            did = self._admit(params) or did
            if not any(r is not None for r in self._slots):
                self._maybe_idle()
                return did
            finished = self._decode_and_harvest(params, version)
        except Exception as e:
            self._fail_all(e)
            raise
        self._finish_subs(finished)
        ci, self._chunk_idx = self._chunk_idx, self._chunk_idx + 1
        if self.chunk_hook is not None:
            try:
                self.chunk_hook(ci)
            except BaseException:
                with self._lock:
                    self._abort_upto = self._seq
                self._abort_rows()
                self._maybe_idle()
                raise
        if self._abort_wanted():
            self._abort_rows()
        self._maybe_idle()
        return True

    def _maybe_idle(self) -> None:
        """Drop the cache and start again from the smallest buckets once no row is running or waiting."""
        with self._lock:
            idle = not self._waiting and self._n_running == 0
            if idle and self._cache is not None:
                self._counters["busy_periods"] += 1
        if idle and self._cache is not None:
            self._reset_slots()

    def _admit(self, params: Params) -> bool:
        """Move waiting rows into free slots (growing B and S as needed) and prefill them."""
        instant, take = [], []
        with self._lock:
            if not self._waiting:
                return False
            n_run = self._n_running
            B = max(self._B, self._batch_bucket(n_run + len(self._waiting)))
            while self._waiting and len(take) < B - n_run:
                r = self._waiting.popleft()
                (instant if r.max_new == 0 else take).append(r)
            self._n_running += len(take)
            c = self._counters
            c["admitted_rows"] += len(take)
            c["admitted_mid_batch"] += len(take) if n_run else 0
            c["max_running_rows"] = max(c["max_running_rows"], n_run + len(take))
            c["completed_rows"] += len(instant)
        now = time.time()
        finished = []
        for r in instant:  # max_new_tokens == 0: nothing to decode
            finished += r.sub._add(r, self._empty_completion(r, "length", now))
        self._finish_subs(finished)
        if take:
            try:
                self._place(take, B, params, now)
            except BaseException as e:  # the rows are in no slot yet, so _fail_all would not see them
                for sub in {r.sub for r in take}:
                    sub.error = e
                    sub._finish()
                raise
        return True

    def _place(self, take: list[_Row], B: int, params: Params, now: float) -> None:
        """Put ``take`` into free slots (B slots at least), prefill them and scatter their K/V into the cache."""
        S = max(self._S, min(self.max_len, _pow2_at_least(max(len(r.prompt) + r.max_new for r in take), 16)))
        need = (max(len(r.stop) for r in take),
                max(len(r.length.think_end_ids) if r.length else 1 for r in take),
                max(len(r.length.interruption_ids) if r.length else 1 for r in take))
        widths = tuple(max(w, _pow2_at_least(n, lo)) for w, n, lo in zip(self._widths, need, (4, 4, 8)))
        self._ensure_capacity(B, S, widths)
        free = [b for b, r in enumerate(self._slots) if r is None][: len(take)]
        T = min(self._S, _pow2_at_least(max(len(r.prompt) - 1 for r in take), 8))
        kb = 4  # rows bucket 4, 16, 64, ...: few prefill compiles
        while kb < len(take):
            kb *= 4
        tokens_kT = np.zeros((kb, T), np.int32)
        slot_k = np.full(kb, self._B, np.int32)  # out of range: dropped
        for i, (b, r) in enumerate(zip(free, take)):
            self._slots[b] = r
            r.t_start = now
            _fill_slot(self._consts, self._st, b, r)
            tokens_kT[i, : len(r.prompt) - 1] = r.prompt[:-1]
            slot_k[i] = b
        self._dirty = True
        new_kv = self._prefill_fn(params, jnp.asarray(tokens_kT))
        self._cache = _scatter_rows_jit(self._cache, new_kv, jnp.asarray(slot_k))

    def _ensure_capacity(self, B: int, S: int, widths: tuple[int, int, int]) -> None:
        """Grow the slots to B, the cache to S positions and the per-row id arrays to ``widths`` (zero padding)."""
        if self._cache is not None and (B, S, widths) == (self._B, self._S, self._widths):
            return
        consts, st = _empty_slots(B, *widths)
        out = {"tok": np.zeros((B, S), np.int32), "lp": np.zeros((B, S), np.float32),
               "ver": np.zeros((B, S), np.int32), "inj": np.zeros((B, S), bool)}
        cfg = self.cfg
        if self._cache is None:
            shape = (cfg.n_layers, B, cfg.n_kv_heads, S, cfg.head_dim)
            self._cache = {n: jnp.zeros(shape, _dt(cfg.dtype)) for n in ("k", "v")}
            self._slots = [None] * B
        else:
            _copy_slots(consts, self._consts)
            _copy_slots(st, self._st)
            _copy_slots(out, self._out)
            pad = ((0, 0), (0, B - self._B), (0, 0), (0, S - self._S), (0, 0))
            self._cache = {n: jnp.pad(c, pad) for n, c in self._cache.items()}
            self._slots += [None] * (B - self._B)
        self._consts, self._st, self._out = consts, st, out
        self._B, self._S, self._widths = B, S, widths
        self._dirty = True

    def _decode_and_harvest(self, params: Params, version: int) -> list[Submission]:
        """Run one decode chunk over all slots; harvest its tokens and finished rows."""
        if self._dirty:
            self._st_dev = {k: jnp.asarray(v) for k, v in self._st.items()}
            self._consts_dev = {k: jnp.asarray(v) for k, v in self._consts.items()}
            self._dirty = False
        use_top_p = any(r is not None and r.top_p < 1.0 and r.temperature > 0 for r in self._slots)
        self._cache, self._st_dev, ys = self._decode_fn(params, self._cache, self._st_dev, self._consts_dev,
                                                        n_steps=self.decode_chunk, use_top_p=use_top_p)
        st_host, (tok_CB, lp_CB, act_CB, inj_CB) = jax.device_get((self._st_dev, ys))
        act_CB = np.asarray(act_CB, bool)
        # a row's active steps are a prefix of the chunk: they go to its buffer right after its earlier tokens
        ii, bb = np.nonzero(act_CB)
        if ii.size:
            col = self._st["n_gen"][bb] + (np.cumsum(act_CB, axis=0) - 1)[ii, bb]
            inj = np.asarray(inj_CB, bool)[ii, bb]
            self._out["tok"][bb, col] = tok_CB[ii, bb]
            self._out["lp"][bb, col] = lp_CB[ii, bb]
            self._out["inj"][bb, col] = inj
            self._out["ver"][bb, col] = np.where(inj, INJECTED_VERSION, version)
        self._st = {k: np.array(v) for k, v in st_host.items()}
        now = time.time()
        finished: list[Submission] = []
        freed = 0
        for b in np.flatnonzero(self._st["done"]):
            r = self._slots[b]
            if r is None:
                continue
            fin = _FINISH_NAMES[int(self._st["finish"][b])]
            finished += r.sub._add(r, self._slot_completion(b, r, fin, now))
            self._slots[b] = None
            freed += 1
        with self._lock:
            self._n_running -= freed
            self._counters["decode_chunks"] += 1
            self._counters["completed_rows"] += freed
        return finished

    def _slot_completion(self, b: int, r: _Row, fin: str, now: float) -> Completion:
        n = int(self._st["n_gen"][b])
        req = r.sub.requests[r.req_idx]
        return Completion(
            request_id=req.request_id, sample_index=r.sample_idx, prompt_ids=list(r.prompt),
            token_ids=self._out["tok"][b, :n].tolist(), logprobs=self._out["lp"][b, :n].astype(float).tolist(),
            versions=self._out["ver"][b, :n].tolist(), injected=self._out["inj"][b, :n].tolist(),
            finish_reason=fin, truncated=fin == "length", think_budget=r.budget,
            timing={"submit": r.sub.t_submit, "start": r.t_start, "done": now}, meta=dict(req.meta),
        )

    @staticmethod
    def _empty_completion(r: _Row, fin: str, now: float) -> Completion:
        req = r.sub.requests[r.req_idx]
        return Completion(request_id=req.request_id, sample_index=r.sample_idx, prompt_ids=list(r.prompt),
                          token_ids=[], logprobs=[], versions=[], injected=[], finish_reason=fin,
                          truncated=fin == "length", think_budget=r.budget,
                          timing={"submit": r.sub.t_submit, "start": now, "done": now}, meta=dict(req.meta))

    def _abort_rows(self) -> None:
        """Finish the rows of every submission up to ``_abort_upto`` with finish reason "abort"."""
        with self._lock:
            upto = self._abort_upto
            gone = [r for r in self._waiting if r.sub.seq <= upto]
            self._waiting = deque(r for r in self._waiting if r.sub.seq > upto)
        now = time.time()
        finished: list[Submission] = []
        freed = 0
        for b, r in enumerate(self._slots):
            if r is not None and r.sub.seq <= upto:
                finished += r.sub._add(r, self._slot_completion(b, r, "abort", now))
                self._slots[b] = None
                self._st["done"][b] = True  # the slot stops generating
                self._dirty = True
                freed += 1
        for r in gone:
            finished += r.sub._add(r, self._empty_completion(r, "abort", now))
        with self._lock:
            self._n_running -= freed
            self._aborted_upto = max(self._aborted_upto, upto)
            self._counters["aborted_rows"] += freed + len(gone)
            self._cv.notify_all()
        self._finish_subs(finished)

    def _fail_all(self, e: BaseException) -> None:
        """The engine failed: every submission with rows in it gets ``e``; the slots start afresh."""
        log.error("JaxEngine: generation failed (%s: %s); failing every submission in flight", type(e).__name__, e)
        with self._lock:
            subs = {r.sub for r in self._waiting} | {r.sub for r in self._slots if r is not None}
            self._waiting.clear()
            self._n_running = 0
            self._aborted_upto = self._abort_upto
            self._cv.notify_all()
        self._reset_slots()
        for sub in sorted(subs, key=lambda s: s.seq):
            sub.error = e
            sub._finish()

    @staticmethod
    def _finish_subs(subs: list[Submission]) -> None:
        for sub in subs:
            sub._finish()
