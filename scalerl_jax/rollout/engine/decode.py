"""Device side of the embedded engine (:mod:`scalerl_jax.rollout.engine`): jitted prefill, single-token decode
forward, the per-row interruption state machine and the decode chunk under ``lax.scan``, over the slot KV cache,
one ``{"k", "v"}: [B, K, S, Dh]`` per layer (the models' own cache layout, :func:`scalerl_jax.models.init_cache`).

Prefill (:func:`_prefill_kv`) runs :func:`forward_cached` over new rows (their prompts minus the last token) on a
cache of exactly T positions and returns their K/V; :func:`_scatter_rows` writes them into their slots. A decode
step (:func:`_decode_step`) feeds each row's pending token at its own position through the model's own cached
forward (:func:`forward_cached` with T = 1, which writes its K/V into the cache in place), takes float32 logits
from the FP32 head (:func:`lm_logits`), chooses the next token and advances the row's state machine (below);
:func:`_decode_chunk` runs ``n_steps`` of them in one ``lax.scan``. Finished and empty slots keep running (static
shapes) but emit nothing. The engine calls the module-level jits (``prefill_kv_jit``, ``scatter_rows_jit``,
``decode_chunk_jit``): engines over the same config share compiled code.

Per-slot arrays (their host mirrors are laid out in :mod:`scalerl_jax.rollout.engine.rows`): constants ``rows``
(sampling parameters, stop ids, length control, the PRNG key and the row's index in its submission) and decode
state ``st`` (pending token, position, tokens generated, done, phase, injection index, answer tokens, think-end
window, finish reason).

Log-probs (see :mod:`scalerl_jax.rollout.engine.sampling`): ``log_softmax(logits / temperature)`` of the chosen
token, before top-p truncation (for temperature 0: ``log_softmax(logits)``), i.e. exactly what the trainer
recomputes with ``token_logprobs(..., temperature=temperature)``. Injected tokens record 0.0.

Interruption length control, per row, inside the jitted loop (:func:`advance_rows`): the state machine and its
decisions are :mod:`scalerl_jax.rollout.length_rule`'s, shared with the client's interruption. In INJECT the
token is forced to ``interruption_ids[i]`` (flagged injected, version INJECTED_VERSION, logprob 0.0) and still
fed through the model, so the answer is conditioned on it. Because the state machine runs per step, the
interruption lands exactly at the budget whatever the chunk size. ``max_new_tokens`` caps every completion
(injected tokens included); with length control it must be at least
``budget_hi + len(interruption_ids) + answer_budget`` (:func:`scalerl_jax.config.completion_budget_error`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import forward_cached, init_cache, lm_logits
from scalerl_jax.models.params import Params
from scalerl_jax.rollout.engine.sampling import sample_tokens
from scalerl_jax.rollout.length_rule import (  # noqa: F401  (FIN_*, FINISH_NAMES, NO_BUDGET: re-exported)
    FIN_INTERRUPTED,
    FIN_LENGTH,
    FIN_NONE,
    FIN_STOP,
    FINISH_NAMES,
    NO_BUDGET,
    PH_ANSWER,
    PH_FREE,
    PH_INJECT,
    PH_THINK,
    length_hit,
    stop_finish,
    think_end_matches,
    think_events,
)


def _prefill_kv(params: Params, tokens_kT: jax.Array, *, cfg: ModelConfig):
    """K/V of new rows ``tokens_kT`` (positions 0..T-1): one ``{"k", "v"}: [k, K, T, Dh]`` per layer.

    Runs :func:`forward_cached` on a cache of exactly T positions (cheap cache writes). Compiled per (k, T) only,
    not per slot-cache shape: the expensive compile is shared by every batch and cache size.
    """
    k, T = tokens_kT.shape
    pos_kT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (k, T))
    _, new = forward_cached(params, tokens_kT, pos_kT, init_cache(cfg, k, T), cfg)
    return new


def _scatter_rows(cache, new, slot_k: jax.Array):
    """Write new rows' K/V (per layer ``[k, K, T, Dh]``) into slots ``slot_k`` of the slot cache (per layer
    ``[B, K, S, Dh]``), positions 0..T-1; a slot index >= B (bucket padding) is dropped. The slot's positions >= T
    keep whatever an earlier row left there: decode overwrites each of them before any query can see it."""
    return tuple({n: c[n].at[slot_k, :, :nw[n].shape[2]].set(nw[n].astype(c[n].dtype), mode="drop")
                  for n in ("k", "v")} for c, nw in zip(cache, new, strict=True))


def _decode_step(params, cache, st: dict, rows: dict, key, *, cfg: ModelConfig, use_top_p: bool):
    """One token for every row: feed the pending token, choose the next, advance the state machine."""
    hidden_B1D, cache = forward_cached(params, st["tok"][:, None], st["pos"][:, None], cache, cfg)
    logits_BV = lm_logits(params, hidden_B1D[:, 0], cfg)
    samp_B, samp_lp_B = sample_tokens(logits_BV, rows["temp"], rows["top_p"], key, use_top_p=use_top_p)
    new_st, ys = advance_rows(st, rows, samp_B, samp_lp_B)
    return cache, new_st, ys


def advance_rows(st: dict, rows: dict, samp_B, samp_lp_B):
    """The state machine's step for every row, given the tokens sampled for them (``samp_B``, log-probs
    ``samp_lp_B``): the token each row emits (forced while injecting), its new decode state, and the outputs
    (token, log-prob, emitted, injected). The decisions are :mod:`scalerl_jax.rollout.length_rule`'s."""
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
    matches_B = think_end_matches(jnp, window_BW, rows["think_end"], rows["think_mask"])

    is_stop_B = active_B & ~inj_B & jnp.any(tok_B[:, None] == rows["stop"], axis=1)
    think_end_hit_B, budget_hit_B = think_events(thinking_B, matches_B, is_stop_B, n_gen_B, rows["budget"])
    new_phase_B = jnp.where(think_end_hit_B, PH_FREE, phase_B)
    new_phase_B = jnp.where(budget_hit_B, PH_INJECT, new_phase_B)
    new_phase_B = jnp.where(inj_finished_B, PH_ANSWER, new_phase_B)
    len_hit_B = length_hit(active_B, is_stop_B, new_phase_B == PH_ANSWER, ans_B, rows["ans_budget"], n_gen_B,
                           rows["max_new"])

    finish_B = st["finish"]
    finish_B = jnp.where(is_stop_B, stop_finish(jnp, phase_B), finish_B)
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
    return new_st, (tok_B, lp_B, active_B, active_B & inj_B)


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
prefill_kv_jit = jax.jit(_prefill_kv, static_argnames=("cfg",))
scatter_rows_jit = jax.jit(_scatter_rows, donate_argnums=(0,))
decode_chunk_jit = jax.jit(_decode_chunk, static_argnames=("cfg", "n_steps", "use_top_p"), donate_argnums=(1, 2))
