"""Embedded JAX generation engine: continuous batching over a slot KV cache, chunked decode, in-flight weight
updates, interruption length control. This module is the host-side scheduler; the jitted prefill and decode are in
:mod:`scalerl_jax.rollout.engine.decode`, submissions, rows and the per-slot host arrays in
:mod:`scalerl_jax.rollout.engine.rows`.

Scheduler (continuous batching). The engine owns ``B`` row *slots* (a power-of-two bucket, at least 8, at most
``max_batch``), one KV cache (per layer ``{"k", "v"}: [B, K, S, Dh]``) and per-slot constants (sampling parameters,
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
3. Decode one chunk: one jitted call runs ``decode_chunk`` steps under ``lax.scan`` over all B slots
   (:mod:`scalerl_jax.rollout.engine.decode`: a step feeds each row's pending token, chooses the next and advances the
   row's interruption state machine). Finished and empty slots keep running (static shapes) but emit nothing.
4. Harvest: the chunk's tokens go to per-slot host buffers; finished rows become Completions and free their
   slots; a submission whose rows are all done completes (its ``on_done`` callback runs on this thread).
5. Call ``chunk_hook(chunk_index)`` (the index counts chunks since the engine was last idle).

When no row is left the cache is dropped and B and S start again from the smallest bucket. Slots are reused
without clearing: a new row's prefill overwrites its prompt positions and every later position is written by
the decode step that feeds it before any query can attend to it.

:meth:`JaxEngine.generate` (blocking; the trainer's in-process path) is ``submit`` followed by ``step`` until
that submission is done: the same scheduler, so requests submitted from other threads meanwhile share the
batch. A server instead runs one driver thread that calls ``step`` while :meth:`JaxEngine.has_work` (see
:class:`scalerl_jax.rollout.engine.driver.EngineDriver`): requests arriving while a batch runs join it at the next
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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import init_cache, param_shapes
from scalerl_jax.models.layers import dtype as to_dtype
from scalerl_jax.models.params import Params
from scalerl_jax.rollout.engine.decode import FINISH_NAMES, decode_chunk_jit, prefill_kv_jit, scatter_rows_jit
from scalerl_jax.rollout.engine.rows import (
    Row,
    Submission,
    copy_slots,
    empty_completion,
    empty_slots,
    fill_slot,
    slot_completion,
    validate_requests,
)
from scalerl_jax.rollout.length_rule import draw_budget
from scalerl_jax.rollout.protocol import INJECTED_VERSION, Completion, GenerationRequest

log = logging.getLogger(__name__)


def _pow2_at_least(n: int, minimum: int = 1) -> int:
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


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

    def __init__(self, model_cfg: ModelConfig, params: Params | None, *, max_batch: int, max_len: int,
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
        # None: no weights until the first update_weights (a run's trainer pushes its state's params at start)
        self._params = None if params is None else self._prepare_params(params)
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
        self._waiting: deque[Row] = deque()
        self._seq = 0  # submissions so far
        self._abort_upto = 0  # abort() asked to finish every submission with seq <= this ...
        self._aborted_upto = 0  # ... and this far it has been done
        self._stepping = False
        self._n_running = 0  # rows in slots
        self._counters = {"decode_chunks": 0, "admitted_rows": 0, "admitted_mid_batch": 0, "max_running_rows": 0,
                          "completed_rows": 0, "aborted_rows": 0, "busy_periods": 0}
        self._prefill_fn = functools.partial(prefill_kv_jit, cfg=model_cfg)
        self._decode_fn = functools.partial(decode_chunk_jit, cfg=model_cfg)
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
        dt = to_dtype(self.cfg.param_dtype)
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
        if self._params is None:
            raise RuntimeError("JaxEngine: no weights yet (built with params=None; call update_weights first)")
        return self._params, self._version

    def reseed(self, seed: int) -> None:
        """Re-seed the sampling key and the NumPy RNG that draws thinking budgets (for submissions from now on)."""
        with self._lock:
            self._rng = np.random.default_rng(seed)
            self._key = jax.random.PRNGKey(seed)

    # ---- requests ----

    def _expand(self, sub: Submission) -> list[Row]:
        """Rows of a validated submission: thinking budgets and sampling keys drawn in row order (under _lock)."""
        rows: list[Row] = []
        if not sub.requests:
            return rows
        # one split per submission whatever its size (a split into n keys would compile once per distinct n)
        self._key, sub_key = jax.random.split(self._key)
        sub_key = np.asarray(sub_key, np.uint32)
        for i, req in enumerate(sub.requests):
            sp, lc = req.params, req.length
            prompt = [int(t) for t in req.prompt_ids]
            for s in range(sp.n):
                budget = draw_budget(self._rng, lc) if lc is not None else None
                rows.append(Row(sub, i, s, prompt, float(sp.temperature), float(sp.top_p), int(sp.max_new_tokens),
                                 tuple(int(t) for t in sp.stop_token_ids), lc, budget, sub_key, len(rows)))
        return rows

    def submit(self, requests: Sequence[GenerationRequest],
               on_done: Callable[[Submission], None] | None = None, *, checked: bool = False) -> Submission:
        """Queue ``requests`` for generation and return at once (thread-safe); ValueError on a bad request
        (:func:`~scalerl_jax.rollout.engine.rows.validate_requests`; ``checked``: the caller has checked them against
        this engine's vocabulary and ``max_len`` already, as the server's
        :func:`~scalerl_jax.rollout.server.wire.parse_generate_body` does).

        The rows join the running batch at the next decode-chunk boundary of whichever thread calls
        :meth:`step` (someone must: :meth:`drive` does it until this submission is done, a server's driver thread
        does it forever). ``on_done(submission)`` runs once all of them have finished.
        """
        requests = list(requests)
        if not checked:
            validate_requests(requests, vocab_size=self.cfg.vocab_size, max_len=self.max_len)
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
        self._slots: list[Row | None] = []
        self._cache: tuple[dict[str, jax.Array], ...] | None = None
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
            finished += r.sub._add(r, empty_completion(r, "length", now))
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

    def _place(self, take: list[Row], B: int, params: Params, now: float) -> None:
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
            fill_slot(self._consts, self._st, b, r)
            tokens_kT[i, : len(r.prompt) - 1] = r.prompt[:-1]
            slot_k[i] = b
        self._dirty = True
        new_kv = self._prefill_fn(params, jnp.asarray(tokens_kT))
        self._cache = scatter_rows_jit(self._cache, new_kv, jnp.asarray(slot_k))

    def _ensure_capacity(self, B: int, S: int, widths: tuple[int, int, int]) -> None:
        """Grow the slots to B, the cache to S positions and the per-row id arrays to ``widths`` (zero padding)."""
        if self._cache is not None and (B, S, widths) == (self._B, self._S, self._widths):
            return
        consts, st = empty_slots(B, *widths)
        out = {"tok": np.zeros((B, S), np.int32), "lp": np.zeros((B, S), np.float32),
               "ver": np.zeros((B, S), np.int32), "inj": np.zeros((B, S), bool)}
        cfg = self.cfg
        if self._cache is None:
            self._cache = init_cache(cfg, B, S)
            self._slots = [None] * B
        else:
            copy_slots(consts, self._consts)
            copy_slots(st, self._st)
            copy_slots(out, self._out)
            pad = ((0, B - self._B), (0, 0), (0, S - self._S), (0, 0))
            self._cache = tuple({n: jnp.pad(c, pad) for n, c in layer.items()} for layer in self._cache)
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
            fin = FINISH_NAMES[int(self._st["finish"][b])]
            finished += r.sub._add(r, slot_completion(r, b, self._st, self._out, fin, now))
            self._slots[b] = None
            freed += 1
        with self._lock:
            self._n_running -= freed
            self._counters["decode_chunks"] += 1
            self._counters["completed_rows"] += freed
        return finished

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
                finished += r.sub._add(r, slot_completion(r, b, self._st, self._out, "abort", now))
                self._slots[b] = None
                self._st["done"][b] = True  # the slot stops generating
                self._dirty = True
                freed += 1
        for r in gone:
            finished += r.sub._add(r, empty_completion(r, "abort", now))
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
