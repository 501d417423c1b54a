"""Completions -> a fixed-shape :class:`~scalerl_jax.train.rl.TrainBatch` (host side, NumPy).

Rewards become advantages (group mean-centred, normalised as configured); zero-variance groups are
dropped from the loss by zeroing their rows' loss mask when ``LossConfig.filter_zero_variance`` is on
(they are never resampled). Prompt and completion tokens share one right-padded row of ``seq_len``;
the loss mask is 1 exactly on completion tokens the policy sampled (not on the prompt, padding or
injected interruption tokens). Rows are padded to ``n_rows`` so the jitted step sees one shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scalerl_jax.config import LossConfig
from scalerl_jax.losses import compute_advantages
from scalerl_jax.rollout.protocol import Completion
from scalerl_jax.train.rl import TrainBatch


@dataclass
class BatchStats:
    n_groups: int
    n_kept_groups: int
    n_filtered_groups: int
    reward_mean: float
    pass_rate: float
    truncation_rate: float
    interruption_rate: float
    completion_len_mean: float
    min_version: int
    max_staleness: int
    n_tokens: int


def build_train_batch(
    groups: Sequence[Sequence[Completion]], rewards: Sequence[np.ndarray], *, version: int, loss_cfg: LossConfig,
    seq_len: int, n_rows: int, pad_id: int, microbatches: int = 1,
) -> tuple[TrainBatch, BatchStats]:
    """Assemble one training batch from ``groups`` (G completions of one prompt each) and their rewards.

    ``version`` is the version of the params about to be updated; staleness of a token = version - the
    version that sampled it. With ``microbatches > 1`` group ids are local to each micro-batch (the train
    step splits the rows into equal consecutive slices), so rows of a group must not straddle a slice.
    """
    rows = [c for g in groups for c in g]
    if len(rows) > n_rows:
        raise ValueError(f"{len(rows)} completions do not fit the batch of {n_rows} rows")
    B, T = n_rows, seq_len
    per_micro = B // microbatches
    tokens = np.full((B, T), pad_id, np.int32)
    mask = np.zeros((B, T), np.float32)
    gen_logp = np.zeros((B, T), np.float32)
    staleness = np.zeros((B, T), np.int32)
    rew = np.zeros(B, np.float32)
    truncated = np.zeros(B, np.float32)
    gid = np.zeros(B, np.int32)
    real = np.zeros(B, bool)
    r = 0
    min_version = version
    for g, (group, grew) in enumerate(zip(groups, rewards)):
        grew = np.asarray(grew, np.float32)
        if len(grew) != len(group):
            raise ValueError(f"group {g}: {len(group)} completions but {len(grew)} rewards")
        if per_micro and (r // per_micro) != ((r + len(group) - 1) // per_micro):
            raise ValueError("a group straddles a micro-batch boundary; make rows per micro-batch a multiple of G")
        for c, rv in zip(group, grew):
            p, comp = list(c.prompt_ids), list(c.token_ids)
            seq = (p + comp)[:T]
            tokens[r, : len(seq)] = seq
            n_c = max(0, min(len(comp), T - len(p)))
            lo = len(p)
            inj = np.asarray(c.injected[:n_c], bool)
            mask[r, lo : lo + n_c] = (~inj).astype(np.float32)
            gen_logp[r, lo : lo + n_c] = np.asarray(c.logprobs[:n_c], np.float32)
            vers = np.asarray(c.versions[:n_c], np.int64)
            staleness[r, lo : lo + n_c] = np.where(inj, 0, version - vers)
            if n_c and (~inj).any():
                min_version = min(min_version, int(vers[~inj].min()))
            rew[r] = rv
            truncated[r] = float(c.truncated)
            gid[r] = g % per_micro if microbatches > 1 else g
            real[r] = True
            r += 1
    # padding rows: their own (unused) group ids, mask 0, reward 0
    for i in range(r, B):
        gid[i] = (len(groups) + (i - r)) % max(per_micro, 1) if microbatches > 1 else min(len(groups) + i - r, B - 1)
    # advantages over the real rows only, with the global group index (not the micro-local one)
    global_gid = np.repeat(np.arange(len(groups)), [len(g) for g in groups]).astype(np.int32)
    adv_real, keep_real = compute_advantages(rew[:r], global_gid, loss_cfg.normalization)
    adv = np.zeros(B, np.float32)
    adv[:r] = np.asarray(adv_real)
    keep = np.zeros(B, bool)
    keep[:r] = np.asarray(keep_real)
    if loss_cfg.filter_zero_variance:
        mask[~keep] = 0.0
    n_groups = len(groups)
    kept_groups = len({int(global_gid[i]) for i in range(r) if keep[i]})
    comp_lens = [len(c.token_ids) for c in rows]
    stats = BatchStats(
        n_groups=n_groups, n_kept_groups=kept_groups, n_filtered_groups=n_groups - kept_groups,
        reward_mean=float(rew[:r].mean()) if r else 0.0, pass_rate=float((rew[:r] > 0).mean()) if r else 0.0,
        truncation_rate=float(truncated[:r].mean()) if r else 0.0,
        interruption_rate=float(np.mean([c.interrupted for c in rows])) if rows else 0.0,
        completion_len_mean=float(np.mean(comp_lens)) if rows else 0.0, min_version=min_version,
        max_staleness=int(staleness.max()) if r else 0, n_tokens=int(mask.sum()),
    )
    batch = TrainBatch(tokens=tokens, loss_mask=mask, gen_logp=gen_logp, staleness=staleness, advantages=adv,
                       rewards=rew, group_ids=gid, truncated=truncated)
    return batch, stats


def batch_is_finite(batch: TrainBatch) -> bool:
    """Host-side check of the values the loss uses (the jitted step checks again and skips on failure)."""
    used = batch.loss_mask > 0
    return bool(np.isfinite(batch.gen_logp[used]).all() and np.isfinite(batch.advantages).all()
                and np.isfinite(batch.rewards).all())
