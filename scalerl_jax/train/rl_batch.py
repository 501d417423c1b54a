"""Completions -> a fixed-shape :class:`~scalerl_jax.train.rl.TrainBatch` (host side, NumPy).

Rewards become advantages (group mean-centred, normalised as configured); zero-variance groups are
dropped from the loss by zeroing their rows' loss mask when ``LossConfig.filter_zero_variance`` is on
(they are never resampled). Prompt and completion tokens share one right-padded row of ``seq_len``;
the loss mask is 1 exactly on completion tokens the policy sampled (not on the prompt, padding or
injected interruption tokens). Rows are padded to ``n_rows`` so the jitted step sees one shape, or, with
``TrainConfig.row_buckets > 1``, the filtered groups are left out and the rows padded to the next of a few
bucket sizes (one compiled step per size): the train step then spends nothing on rows the loss ignores.
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
    rows_wanted: int = 0  # the compacted batch's row count by the quantum alone (build_train_batch's row_sizes)


def bucket_quantum(n_rows: int, buckets: int, multiple: int) -> int:
    """The step between the row counts a compacted batch may take: ``n_rows / buckets`` rounded up to a multiple
    of ``multiple`` (micro-batches x group size, and the mesh's batch shards), so that at most ``buckets`` sizes
    are compiled. 0 (no compaction: every batch has ``n_rows`` rows) when ``buckets <= 1``."""
    if buckets <= 1:
        return 0
    step = -(-n_rows // buckets)
    return -(-step // multiple) * multiple


def build_train_batch(
    groups: Sequence[Sequence[Completion]], rewards: Sequence[np.ndarray], *, version: int, loss_cfg: LossConfig,
    seq_len: int, n_rows: int, pad_id: int, microbatches: int = 1, row_quantum: int = 0,
    row_sizes: Sequence[int] | None = None, prompt_cols: int = 0, group_size: int = 0,
) -> tuple[TrainBatch, BatchStats]:
    """Assemble one training batch from ``groups`` (G completions of one prompt each) and their rewards.

    ``version`` is the version of the params about to be updated; staleness of a token = version - the
    version that sampled it. With ``microbatches > 1`` group ids are local to each micro-batch (the train
    step splits the rows into equal consecutive slices), so rows of a group must not straddle a slice.

    ``row_quantum > 0`` compacts the batch: the groups the loss ignores (zero-variance groups when
    ``filter_zero_variance`` is on) are left out and the rows are padded up to the next multiple of
    ``row_quantum`` (at most ``n_rows``) instead of to ``n_rows``. The loss is a sum over masked-in tokens whose
    weights count only masked-in tokens, rows and prompts (losses/policy.py), so it and its gradient are the
    full batch's up to the order of float summation; the advantages and the stats are computed over every
    completion either way (batch normalisation's std includes the zero-variance groups). ``row_sizes``: the row
    counts the batch may take (those the train step has compiled); the smallest of them (or ``n_rows``) that holds
    the compacted rows is used, and ``stats.rows_wanted`` says what the quantum alone would give.
    ``prompt_cols > 0`` writes the split layout (scalerl_jax/train/rl.py): completions start at that column, every
    group has exactly ``group_size`` rows (checked), and every prompt fits ``prompt_cols`` (checked).
    """
    rows = [c for g in groups for c in g]
    if len(rows) > n_rows:
        raise ValueError(f"{len(rows)} completions do not fit the batch of {n_rows} rows")
    rew_all = np.zeros(len(rows), np.float32)
    r = 0
    for g, (group, grew) in enumerate(zip(groups, rewards)):
        grew = np.asarray(grew, np.float32)
        if len(grew) != len(group):
            raise ValueError(f"group {g}: {len(group)} completions but {len(grew)} rewards")
        rew_all[r : r + len(group)] = grew
        r += len(group)
    n_real = r
    # advantages over every real row with the global group index (not the micro-local one)
    global_gid = np.repeat(np.arange(len(groups)), [len(g) for g in groups]).astype(np.int32)
    adv_all, keep_all = compute_advantages(rew_all, global_gid, loss_cfg.normalization)
    adv_all, keep_all = np.asarray(adv_all, np.float32), np.asarray(keep_all, bool)
    starts = np.concatenate([[0], np.cumsum([len(g) for g in groups])]).astype(int)
    group_kept = [bool(keep_all[starts[g]]) if len(groups[g]) else False for g in range(len(groups))]
    if row_quantum > 0:
        chosen = [g for g in range(len(groups)) if group_kept[g] or not loss_cfg.filter_zero_variance]
        n_chosen = sum(len(groups[g]) for g in chosen)
        wanted = min(n_rows, max(row_quantum, -(-n_chosen // row_quantum) * row_quantum))
        B = wanted if row_sizes is None else min(x for x in (*row_sizes, n_rows) if wanted <= x <= n_rows)
    else:
        chosen, B = list(range(len(groups))), n_rows
        wanted = B
    T = seq_len
    if prompt_cols:
        if not 0 < prompt_cols < T or group_size < 1:
            raise ValueError(f"the split layout needs 0 < prompt_cols < seq_len ({prompt_cols}, {T}) and group_size "
                             f">= 1 ({group_size})")
        for g in chosen:
            if len(groups[g]) != group_size:
                raise ValueError(f"group {g} has {len(groups[g])} completions, the split layout needs {group_size}")
            longest = max((len(c.prompt_ids) for c in groups[g]), default=0)
            if longest > prompt_cols:
                raise ValueError(f"group {g}: a prompt of {longest} tokens does not fit prompt_cols={prompt_cols}")
    per_micro = B // microbatches
    tokens = np.full((B, T), pad_id, np.int32)
    mask = np.zeros((B, T), np.float32)
    gen_logp = np.zeros((B, T), np.float32)
    staleness = np.zeros((B, T), np.int32)
    rew = np.zeros(B, np.float32)
    adv = np.zeros(B, np.float32)
    keep = np.zeros(B, bool)
    truncated = np.zeros(B, np.float32)
    gid = np.zeros(B, np.int32)
    plen = np.zeros(B, np.int32)
    min_version, max_staleness = version, 0
    for g in range(len(groups)):  # every group's versions count towards the batch's staleness
        for c in groups[g]:
            n_c = max(0, min(len(c.token_ids), T - (prompt_cols or len(c.prompt_ids))))
            inj = np.asarray(c.injected[:n_c], bool)
            vers = np.asarray(c.versions[:n_c], np.int64)
            if n_c and (~inj).any():
                min_version = min(min_version, int(vers[~inj].min()))
                max_staleness = max(max_staleness, int((version - vers[~inj]).max()))
    r = 0
    for j, g in enumerate(chosen):
        group = groups[g]
        if per_micro and (r // per_micro) != ((r + len(group) - 1) // per_micro):
            raise ValueError("a group straddles a micro-batch boundary; make rows per micro-batch a multiple of G")
        for i, c in enumerate(group):
            src = starts[g] + i
            p, comp = list(c.prompt_ids), list(c.token_ids)
            lo = prompt_cols or len(p)  # the completion's first column
            n_c = max(0, min(len(comp), T - lo))
            tokens[r, : min(len(p), T)] = p[:T]
            tokens[r, lo : lo + n_c] = comp[:n_c]
            plen[r] = len(p)
            inj = np.asarray(c.injected[:n_c], bool)
            mask[r, lo : lo + n_c] = (~inj).astype(np.float32)
            gen_logp[r, lo : lo + n_c] = np.asarray(c.logprobs[:n_c], np.float32)
            vers = np.asarray(c.versions[:n_c], np.int64)
            staleness[r, lo : lo + n_c] = np.where(inj, 0, version - vers)
            rew[r], adv[r], keep[r] = rew_all[src], adv_all[src], keep_all[src]
            truncated[r] = float(c.truncated)
            gid[r] = j % per_micro if microbatches > 1 else j
            r += 1
    # padding rows: their own (unused) group ids, mask 0, reward 0
    for i in range(r, B):
        gid[i] = (len(chosen) + (i - r)) % max(per_micro, 1) if microbatches > 1 else min(len(chosen) + i - r, B - 1)
    if loss_cfg.filter_zero_variance:
        mask[~keep] = 0.0
    n_groups = len(groups)
    kept_groups = sum(group_kept)
    comp_lens = [len(c.token_ids) for c in rows]
    stats = BatchStats(
        n_groups=n_groups, n_kept_groups=kept_groups, n_filtered_groups=n_groups - kept_groups,
        reward_mean=float(rew_all.mean()) if n_real else 0.0, pass_rate=float((rew_all > 0).mean()) if n_real else 0.0,
        truncation_rate=float(np.mean([c.truncated for c in rows])) if rows else 0.0,
        interruption_rate=float(np.mean([c.interrupted for c in rows])) if rows else 0.0,
        completion_len_mean=float(np.mean(comp_lens)) if rows else 0.0, min_version=min_version,
        max_staleness=max_staleness, n_tokens=int(mask.sum()), rows_wanted=wanted,
    )
    batch = TrainBatch(tokens=tokens, loss_mask=mask, gen_logp=gen_logp, staleness=staleness, advantages=adv,
                       rewards=rew, group_ids=gid, truncated=truncated, prompt_len=plen)
    return batch, stats


def batch_is_finite(batch: TrainBatch) -> bool:
    """Host-side check of the values the loss uses (the jitted step checks again and skips on failure)."""
    used = batch.loss_mask > 0
    return bool(np.isfinite(batch.gen_logp[used]).all() and np.isfinite(batch.advantages).all()
                and np.isfinite(batch.rewards).all())
