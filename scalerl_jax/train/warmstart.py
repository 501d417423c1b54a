"""Supervised warm start: next-token cross-entropy on problem solutions (the tiny default's first phase)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import numpy as np

from scalerl_jax.config import ModelConfig, TrainConfig
from scalerl_jax.data.tasks import THINK_MARKER, Problem
from scalerl_jax.models.model import init_params
from scalerl_jax.train.losses import cross_entropy_loss
from scalerl_jax.train.optim import make_optimizer
from scalerl_jax.train.step import init_train_state, make_train_step


def sft_arrays(problems: Sequence[Problem], encode: Callable[[str], list[int]], eos_id: int, pad_id: int,
               seq_len: int, bos_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """tokens [N, T] = (bos) prompt + solution + eos, right padded; loss_mask 1 on solution and eos tokens."""
    tokens = np.full((len(problems), seq_len), pad_id, np.int32)
    mask = np.zeros((len(problems), seq_len), np.float32)
    for i, p in enumerate(problems):
        pre = encode(p.prompt)
        if bos_id is not None and pre[:1] != [bos_id]:  # a chat template may have written it
            pre = [bos_id, *pre]
        sol = encode(p.solution) + [eos_id]
        seq = (pre + sol)[:seq_len]
        if len(pre) + len(sol) > seq_len:
            raise ValueError(f"problem {p.prompt_id}: {len(pre) + len(sol)} tokens exceed seq_len {seq_len}")
        tokens[i, : len(seq)] = seq
        mask[i, len(pre) : len(seq)] = 1.0
    return tokens, mask


def warm_start(model_cfg: ModelConfig, problems: Sequence[Problem], *, encode, eos_id: int, pad_id: int,
               seq_len: int, steps: int, batch_size: int, lr: float, warmup: int, seed: int,
               log: Callable[[str], None] = print, log_path: str | Path | None = None, params=None,
               unmarked_frac: float = 0.0, unmark: Callable[[str], str] | None = None):
    """Train from scratch (or from ``params``) for ``steps`` AdamW steps with warm-up + cosine. Returns params.

    ``unmarked_frac``: the fraction of examples whose target is ``unmark(solution)``, a worked answer the verifier
    scores as wrong. The default ``unmark`` (the tiny task) works the scratchpad but never marks a final answer
    (ends after ``a+X=Y``, no ``#Y``): the warm-started policy then often computes the answer without committing
    to it, which RL has to learn (see ``tiny_plan``). The word-problem task boxes the product instead of the
    result (:func:`scalerl_jax.data.word_arith.box_the_product`).
    """
    if not 0.0 <= unmarked_frac <= 1.0:
        raise ValueError(f"warm_start: unmarked_frac must be in [0, 1], got {unmarked_frac}")
    tokens, mask = sft_arrays(problems, encode, eos_id, pad_id, seq_len, model_cfg.bos_token_id)
    if unmarked_frac > 0:
        unmark = unmark or (lambda sol: sol.rsplit(THINK_MARKER, 1)[0])
        unmarked = [dataclasses.replace(p, solution=unmark(p.solution)) for p in problems]
        u_tokens, u_mask = sft_arrays(unmarked, encode, eos_id, pad_id, seq_len, model_cfg.bos_token_id)
    tcfg = TrainConfig(lr=lr, warmup_steps=warmup, schedule="cosine", steps=steps, adam_eps=1e-8,
                       weight_decay=0.01, grad_clip=1.0)
    opt = make_optimizer(tcfg)
    params = init_params(model_cfg, jax.random.key(seed)) if params is None else params
    state = init_train_state(params, opt)
    step = jax.jit(make_train_step(cross_entropy_loss(model_cfg), opt), donate_argnums=(0,))
    rng = np.random.default_rng(seed)
    f = open(log_path, "w") if log_path else None
    t0 = time.perf_counter()
    for s in range(steps):
        idx = rng.integers(0, len(problems), batch_size)
        tb, mb = tokens[idx], mask[idx]
        if unmarked_frac > 0:
            use = rng.random(batch_size) < unmarked_frac
            tb, mb = np.where(use[:, None], u_tokens[idx], tb), np.where(use[:, None], u_mask[idx], mb)
        state, m = step(state, {"tokens": tb, "loss_mask": mb})
        if (s + 1) % 50 == 0 or s == steps - 1:
            loss = float(m["loss"])
            el = time.perf_counter() - t0
            eta = el / (s + 1) * (steps - s - 1)
            log(f"[warmstart] step {s + 1}/{steps} loss {loss:.4f} ({el:.0f}s, eta {eta:.0f}s)")
            if f:
                f.write(json.dumps({"kind": "warmstart", "step": s + 1, "loss": loss, "seconds": el}) + "\n")
    if f:
        f.close()
    return state.params
