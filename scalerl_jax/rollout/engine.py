"""Embedded JAX generation engine: KV-cache prefill + chunked decode, in-flight weight updates, interruption.

How a :meth:`JaxEngine.generate` call runs:

1. Every request is validated and expanded into ``n`` rows (samples). Rows are processed in waves of at most
   ``max_batch``; a wave is padded to a power-of-two batch bucket so the jitted functions see a handful of
   static shapes and compile once per bucket.
2. Prefill: the prompt minus its last token is run through :func:`forward_cached` (right padded, positions
   0..P-2 per row). The last prompt token becomes the row's *pending* token.
3. Decode: one jitted call runs ``decode_chunk`` steps under ``lax.scan``. A step feeds each row's pending
   token at its own position (writing its K/V into the cache), takes float32 logits from the FP32 head
   (:func:`lm_logits`), chooses the next token and advances a per-row state machine (below). The chosen
   token becomes the pending one. Finished rows keep running (static shapes) but emit nothing.
4. Between chunks the host checks whether every row is done and installs weights that arrived through
   :meth:`JaxEngine.update_weights`. Rows keep their KV cache (PipelineRL's in-flight update, RECIPE.md
   section 3), so after a swap the cache mixes keys/values of both versions.

Versions: a token records the version of the params whose logits it was drawn from, i.e. the params of the
decode chunk that produced it. After a swap following chunk ``m`` (chunk size C, prompt length P), the
positions < P-1+mC were fed by the old params and completion tokens ``mC..`` carry the new version.

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
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.llama import (
    Params, _dt, _embed, forward_cached, init_cache, lm_logits, param_shapes, rms_norm, rope_inv_freq,
)
from scalerl_jax.rollout.protocol import INJECTED_VERSION, Completion, GenerationRequest, LengthControl
from scalerl_jax.rollout.sampling import sample_tokens

PH_THINK, PH_INJECT, PH_ANSWER, PH_FREE = 0, 1, 2, 3
FIN_NONE, FIN_STOP, FIN_LENGTH, FIN_INTERRUPTED = 0, 1, 2, 3
_FINISH_NAMES = {FIN_STOP: "stop", FIN_LENGTH: "length", FIN_INTERRUPTED: "interrupted"}
_NO_BUDGET = 2**30


def _pow2_at_least(n: int, minimum: int = 1) -> int:
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


# ---- jitted pieces ------------------------------------------------------------------------------------


def _prefill(params: Params, tokens_BT: jax.Array, *, cfg: ModelConfig, slots: int):
    """K/V of ``tokens_BT`` (positions 0..T-1 in every row) in a fresh cache of ``slots`` slots, in the decode
    layout ``{"k", "v"}: [L, B, K, S, Dh]``. The prefill runs :func:`forward_cached` on a cache of exactly T
    slots (cheap cache writes), which is then zero-padded to ``slots``."""
    B, T = tokens_BT.shape
    pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    _, cache = forward_cached(params, tokens_BT, pos_BT, init_cache(cfg, B, T), cfg)
    pad = ((0, 0), (0, 0), (0, 0), (0, slots - T), (0, 0))
    return {n: jnp.pad(jnp.swapaxes(cache[n], 2, 3), pad) for n in ("k", "v")}


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


def _decode_chunk(params, cache, st, rows, key, *, cfg: ModelConfig, n_steps: int, use_top_p: bool):
    """``n_steps`` decode steps in one ``lax.scan``; returns (cache, state, per-step outputs [n_steps, B])."""

    def body(carry, i):
        cache, st = carry
        cache, st, ys = _decode_step(params, cache, st, rows, jax.random.fold_in(key, i), cfg=cfg,
                                     use_top_p=use_top_p)
        return (cache, st), ys

    (cache, st), ys = jax.lax.scan(body, (cache, st), jnp.arange(n_steps))
    return cache, st, ys


# Module-level jits (the config is a static, hashable argument): engines over the same config share compiled code.
_prefill_jit = jax.jit(_prefill, static_argnames=("cfg", "slots"))
_decode_chunk_jit = jax.jit(_decode_chunk, static_argnames=("cfg", "n_steps", "use_top_p"), donate_argnums=(1, 2))


# ---- host side ---------------------------------------------------------------------------------------


@dataclass
class _Row:
    req_idx: int
    sample_idx: int
    prompt: list[int]
    temperature: float
    top_p: float
    max_new: int
    stop: tuple[int, ...]
    length: LengthControl | None
    budget: int | None


class JaxEngine:
    """In-process :class:`~scalerl_jax.rollout.protocol.Generator` over the functional Llama.

    Args:
      model_cfg: the model's :class:`ModelConfig`.
      params: params pytree (our layout; NumPy or JAX arrays).
      max_batch: most rows (samples) decoded together; more rows run in successive waves.
      max_len: KV-cache slots per row; every request needs ``len(prompt) + max_new_tokens <= max_len``.
      decode_chunk: decode steps per jitted call (weights can change and the host checks for completion only
        between chunks).
      seed: seeds both the sampling key and the NumPy RNG that draws thinking budgets.
      version: version tag of ``params``.

    ``generate`` calls are serialised (one at a time); ``update_weights`` may be called from any thread at any
    time. ``chunk_hook`` (optional callable taking the chunk index) runs on the generating thread after each
    decode chunk, before pending weights are installed; tests use it to make a swap deterministic.
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
        self._lock = threading.Lock()  # guards _params/_version/_pending/_busy
        self._gen_lock = threading.Lock()  # serialises generate()
        self._busy = False
        self._rng = np.random.default_rng(seed)
        self._key = jax.random.PRNGKey(seed)
        self._prefill_fn = functools.partial(_prefill_jit, cfg=model_cfg)
        self._decode_fn = functools.partial(_decode_chunk_jit, cfg=model_cfg)

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

        Thread-safe. Generation in flight picks them up at its next decode-chunk boundary and keeps its KV cache.
        """
        if isinstance(weights, (str, os.PathLike)):
            from scalerl_jax.models.hf_io import load_hf_checkpoint

            weights, cfg = load_hf_checkpoint(weights, param_dtype=self.cfg.param_dtype)
            if param_shapes(cfg) != param_shapes(self.cfg):
                raise ValueError(f"JaxEngine.update_weights: checkpoint shapes {param_shapes(cfg)} differ from the "
                                 f"engine's {param_shapes(self.cfg)}")
        prepared = self._prepare_params(weights)
        with self._lock:
            if self._busy:
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
            if self._pending is not None:
                (self._params, self._version), self._pending = self._pending, None
            return self._params, self._version

    # ---- requests ----

    def _expand(self, requests: Sequence[GenerationRequest]) -> list[_Row]:
        """Validate requests and expand them into rows (ValueError naming the request on bad input)."""
        V = self.cfg.vocab_size
        rows = []
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
            for s in range(sp.n):
                budget = int(self._rng.integers(lc.budget_lo, lc.budget_hi + 1)) if lc is not None else None
                rows.append(_Row(i, s, prompt, float(sp.temperature), float(sp.top_p), int(sp.max_new_tokens),
                                 tuple(int(t) for t in sp.stop_token_ids), lc, budget))
        return rows

    def _batch_bucket(self, n: int) -> int:
        return min(self.max_batch, _pow2_at_least(n, 8))

    def _row_arrays(self, rows: list[_Row], B: int) -> tuple[dict, dict]:
        """Per-row constants and initial decode state as NumPy arrays padded to B rows."""
        S = _pow2_at_least(max((len(r.stop) for r in rows), default=1), 4)
        W = _pow2_at_least(max((len(r.length.think_end_ids) for r in rows if r.length), default=1), 4)
        I = _pow2_at_least(max((len(r.length.interruption_ids) for r in rows if r.length), default=1), 8)
        c = {
            "temp": np.zeros(B, np.float32), "top_p": np.ones(B, np.float32), "max_new": np.zeros(B, np.int32),
            "stop": np.full((B, S), -1, np.int32), "budget": np.full(B, _NO_BUDGET, np.int32),
            "inter_ids": np.zeros((B, I), np.int32), "inter_len": np.ones(B, np.int32),
            "ans_budget": np.zeros(B, np.int32), "think_end": np.full((B, W), -1, np.int32),
            "think_mask": np.zeros((B, W), bool),
        }
        st = {
            "tok": np.zeros(B, np.int32), "pos": np.zeros(B, np.int32), "n_gen": np.zeros(B, np.int32),
            "done": np.ones(B, bool), "phase": np.full(B, PH_FREE, np.int32), "inj_idx": np.zeros(B, np.int32),
            "ans": np.zeros(B, np.int32), "window": np.full((B, W), -1, np.int32),
            "finish": np.full(B, FIN_LENGTH, np.int32),
        }
        for b, r in enumerate(rows):
            c["temp"][b], c["top_p"][b], c["max_new"][b] = r.temperature, r.top_p, r.max_new
            c["stop"][b, : len(r.stop)] = r.stop
            st["tok"][b], st["pos"][b] = r.prompt[-1], len(r.prompt) - 1
            st["done"][b] = r.max_new == 0
            st["finish"][b] = FIN_LENGTH if r.max_new == 0 else FIN_NONE
            if r.length is not None:
                lc = r.length
                c["budget"][b], c["ans_budget"][b] = r.budget, lc.answer_budget
                c["inter_ids"][b, : len(lc.interruption_ids)] = lc.interruption_ids
                c["inter_len"][b] = len(lc.interruption_ids)
                c["think_end"][b, W - len(lc.think_end_ids):] = lc.think_end_ids
                c["think_mask"][b, W - len(lc.think_end_ids):] = True
                st["phase"][b] = PH_THINK
        return c, st

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Blocking: ``n`` completions per request, in request order (see the module docstring)."""
        t_submit = time.time()
        with self._gen_lock:
            rows = self._expand(requests)
            with self._lock:
                self._busy = True
            try:
                comps: list[Completion] = []
                for w in range(0, len(rows), self.max_batch):
                    comps += self._run_wave(requests, rows[w: w + self.max_batch], t_submit)
            finally:
                with self._lock:
                    self._busy = False
                self._current()  # install weights that arrived after the last chunk
        out: list[list[Completion]] = [[] for _ in requests]
        for comp, row in zip(comps, rows):
            out[row.req_idx].append(comp)
        return out

    def _run_wave(self, requests: Sequence[GenerationRequest], rows: list[_Row], t_submit: float) -> list[Completion]:
        t_start = time.time()
        B = self._batch_bucket(len(rows))
        T = min(self.max_len, _pow2_at_least(max(len(r.prompt) - 1 for r in rows), 8))
        consts_np, st_np = self._row_arrays(rows, B)
        tokens_BT = np.zeros((B, T), np.int32)
        for b, r in enumerate(rows):
            tokens_BT[b, : len(r.prompt) - 1] = r.prompt[:-1]
        use_top_p = any(r.top_p < 1.0 and r.temperature > 0 for r in rows)
        self._key, wave_key = jax.random.split(self._key)

        params, version = self._current()
        S = min(self.max_len, _pow2_at_least(max(len(r.prompt) + r.max_new for r in rows), 16))
        T = min(T, S)
        cache = self._prefill_fn(params, jnp.asarray(tokens_BT), slots=S)
        consts = {k: jnp.asarray(v) for k, v in consts_np.items()}
        st = {k: jnp.asarray(v) for k, v in st_np.items()}
        done_at = np.full(B, np.nan)
        outs, step_versions = [], []
        n_chunks = -(-max(r.max_new for r in rows) // self.decode_chunk)
        for ci in range(n_chunks):
            if ci > 0:
                params, version = self._current()
            cache, st, ys = self._decode_fn(params, cache, st, consts, jax.random.fold_in(wave_key, ci),
                                            n_steps=self.decode_chunk, use_top_p=use_top_p)
            outs.append(ys)
            step_versions.append(np.full(self.decode_chunk, version, np.int64))
            done = np.asarray(st["done"])
            now = time.time()
            done_at[np.isnan(done_at) & done] = now
            if self.chunk_hook is not None:
                self.chunk_hook(ci)
            if done.all():
                break
        finish = np.asarray(st["finish"])
        if outs:
            host = jax.device_get(outs)
            tok_NB, lp_NB, act_NB, inj_NB = (np.concatenate([o[k] for o in host], axis=0) for k in range(4))
            ver_N = np.concatenate(step_versions)
        else:
            tok_NB = lp_NB = act_NB = inj_NB = np.zeros((0, B))
            ver_N = np.zeros(0, np.int64)
        done_at[np.isnan(done_at)] = time.time()

        comps = []
        for b, r in enumerate(rows):
            m = act_NB[:, b].astype(bool)
            inj = inj_NB[m, b].astype(bool)
            fin = _FINISH_NAMES[int(finish[b])]
            req = requests[r.req_idx]
            comps.append(Completion(
                request_id=req.request_id, sample_index=r.sample_idx, prompt_ids=list(r.prompt),
                token_ids=tok_NB[m, b].astype(int).tolist(), logprobs=lp_NB[m, b].astype(float).tolist(),
                versions=np.where(inj, INJECTED_VERSION, ver_N[m]).astype(int).tolist(), injected=inj.tolist(),
                finish_reason=fin, truncated=fin == "length", think_budget=r.budget,
                timing={"submit": t_submit, "start": t_start, "done": float(done_at[b])}, meta=dict(req.meta),
            ))
        return comps
