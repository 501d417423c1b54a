"""Batch assembly against a hand-built reference: seven Completions (stop tokens, interruption-injected tokens, one
completion longer than its row, a zero-variance group, a padding row) through ``build_train_batch``; every array
of the TrainBatch is written out by hand below, and the advantages are worked by hand from RECIPE.md section 2:

    Ahat_i = r_i - mean_g(r)       batch: Ahat_i / std(Ahat over kept groups)   prompt: Ahat_i / std_g(r)   none: Ahat_i

(population standard deviations; zero-variance groups are dropped from the loss: mask 0 and advantage 0).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalerl_jax.config import LossConfig
from scalerl_jax.losses.advantages import EPS
from scalerl_jax.rollout.protocol import INJECTED_VERSION, Completion
from scalerl_jax.train.rl_batch import build_train_batch
from tests.tolerances import max_rel, model_rel, ops, reorder_rel, rl_loss_scale

VERSION = 5  # the version about to be updated: staleness = 5 - the token's version
T, ROWS, PAD = 10, 8, 16  # row length, rows (7 completions + 1 padding row), pad id (not 0, to catch zero-fill)
X = INJECTED_VERSION
F, I = False, True  # noqa: E741  (injected flags)


def comp(prompt, tokens, logprobs, versions, injected=None, finish="stop", truncated=False) -> Completion:
    return Completion(request_id="r", sample_index=0, prompt_ids=list(prompt), token_ids=list(tokens),
                      logprobs=list(logprobs), versions=list(versions),
                      injected=list(injected or [False] * len(tokens)), finish_reason=finish, truncated=truncated)


def groups_and_rewards():
    g0 = [  # prompt [3, 4]
        comp([3, 4], [8, 9, 1], [-0.1, -0.2, -0.3], [5, 4, 4]),  # stop token 1 at the end
        comp([3, 4], [8, 10, 13, 14, 9, 1], [-0.5, -0.6, 0.0, 0.0, -0.7, -0.8], [3, 3, X, X, 4, 4],
             [F, F, I, I, F, F], finish="interrupted"),  # 13, 14 injected by length control, then answer + stop
    ]
    g1 = [  # prompt [3, 5, 6]
        # 3 + 9 = 12 tokens > T = 10: only the first 7 completion tokens fit (their versions: 5 5 5 5 4 4 4; the
        # two cut tokens carry version 1, which must not count anywhere)
        comp([3, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14, 15], [-1.0, -1.1, -1.2, -1.3, -1.4, -1.5, -1.6, -1.7, -1.8],
             [5, 5, 5, 5, 4, 4, 4, 1, 1], finish="length", truncated=True),
        comp([3, 5, 6], [2, 1], [-0.4, -0.9], [5, 5]),
        comp([3, 5, 6], [2, 13, 14, 15], [-0.25, 0.0, 0.0, -0.35], [4, X, X, 5], [F, I, I, F], finish="length",
             truncated=True),  # interrupted, then ran out of answer budget
    ]
    g2 = [  # prompt [4]; both solved: zero variance, filtered
        comp([4], [9, 1], [-0.05, -0.06], [5, 5]),
        comp([4], [10, 11, 12, 1], [-0.01, -0.02, -0.03, -0.04], [5, 5, 5, 5]),
    ]
    rewards = [np.array([1.0, -1.0]), np.array([1.0, -1.0, -1.0]), np.array([1.0, 1.0])]
    return [g0, g1, g2], rewards


P = PAD
TOKENS = [
    [3, 4, 8, 9, 1, P, P, P, P, P],
    [3, 4, 8, 10, 13, 14, 9, 1, P, P],
    [3, 5, 6, 7, 8, 9, 10, 11, 12, 13],
    [3, 5, 6, 2, 1, P, P, P, P, P],
    [3, 5, 6, 2, 13, 14, 15, P, P, P],
    [4, 9, 1, P, P, P, P, P, P, P],
    [4, 10, 11, 12, 1, P, P, P, P, P],
    [P] * T,
]
# 1 exactly on sampled completion tokens (not prompt, padding, injected tokens; nothing in the filtered group 2)
MASK = [
    [0, 0, 1, 1, 1, 0, 0, 0, 0, 0],
    [0, 0, 1, 1, 0, 0, 1, 1, 0, 0],
    [0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
    [0, 0, 0, 1, 1, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 0, 0, 1, 0, 0, 0],
    [0] * T,
    [0] * T,
    [0] * T,
]
MASK_UNFILTERED_G2 = [[0, 1, 1, 0, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 0, 0, 0, 0, 0]]
# gen_logp[t] is the generator's log-prob of tokens[t] itself (the trainer compares it with the log-prob that
# position t - 1 predicts for token t)
GEN_LOGP = [
    [0, 0, -0.1, -0.2, -0.3, 0, 0, 0, 0, 0],
    [0, 0, -0.5, -0.6, 0, 0, -0.7, -0.8, 0, 0],
    [0, 0, 0, -1.0, -1.1, -1.2, -1.3, -1.4, -1.5, -1.6],
    [0, 0, 0, -0.4, -0.9, 0, 0, 0, 0, 0],
    [0, 0, 0, -0.25, 0, 0, -0.35, 0, 0, 0],
    [0, -0.05, -0.06, 0, 0, 0, 0, 0, 0, 0],
    [0, -0.01, -0.02, -0.03, -0.04, 0, 0, 0, 0, 0],
    [0] * T,
]
# 5 - version on completion tokens; 0 on injected tokens (their version is INJECTED_VERSION), prompt and padding
STALENESS = [
    [0, 0, 0, 1, 1, 0, 0, 0, 0, 0],
    [0, 0, 2, 2, 0, 0, 1, 1, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 1, 1, 1],
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
    [0] * T,
    [0] * T,
    [0] * T,
]
REWARDS = [1, -1, 1, -1, -1, 1, 1, 0]
TRUNCATED = [0, 0, 1, 0, 1, 0, 0, 0]
GROUP_IDS = [0, 0, 1, 1, 1, 2, 2, 3]  # the padding row gets its own unused group id (3 groups + 0)

# Advantages by hand. Ahat: group 0 mean 0 -> (1, -1); group 1 mean -1/3 -> (4/3, -2/3, -2/3); group 2 (rewards
# 1, 1) is zero-variance -> 0, and so is the padding row.
# batch: the kept Ahat (1, -1, 4/3, -2/3, -2/3) have mean 0 and variance (1 + 1 + 16/9 + 4/9 + 4/9) / 5 = 14/15, so
#   A = Ahat * sqrt(15/14) (the filtered group's zeros are not part of the std: with them it would be sqrt(3/2)).
# prompt: group 0's reward std is 1; group 1's is sqrt(((4/3)^2 + 2 (2/3)^2) / 3) = sqrt(8/9) = 2 sqrt(2) / 3, so
#   A = (4/3, -2/3, -2/3) * 3 / (2 sqrt 2) = (sqrt 2, -1/sqrt 2, -1/sqrt 2).
# none: A = Ahat.
_S = math.sqrt(15 / 14)
# float32 advantages against these float64 values (tests/tolerances.py): a group mean (at most 7 additions and a
# division), the centring, the variance (squares, 7 additions, a division), its square root, + EPS and the division:
# 21 roundings, doubled for the centring's cancellation (|r - mean| >= 2/3 of |r| + |mean| here) and the square
# root's halving not counted; and EPS itself, which these values leave out: EPS / std, std >= 0.94 here.
ADV_RTOL = ops(2 * 21) + EPS / 0.94
MEAN7 = ops(8)  # a mean of 7 float32 values: 6 adds and a division (tests/tolerances.py)
ADVANTAGES = {
    "batch": [_S, -_S, 4 / 3 * _S, -2 / 3 * _S, -2 / 3 * _S, 0, 0, 0],
    "prompt": [1, -1, math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 0, 0, 0],
    "none": [1, -1, 4 / 3, -2 / 3, -2 / 3, 0, 0, 0],
}


@pytest.mark.parametrize("normalization", ["batch", "prompt", "none"])
def test_build_train_batch_matches_hand_built_arrays(normalization):
    groups, rewards = groups_and_rewards()
    batch, stats = build_train_batch(groups, rewards, version=VERSION, seq_len=T, n_rows=ROWS, pad_id=PAD,
                                     loss_cfg=LossConfig(normalization=normalization, filter_zero_variance=True))
    np.testing.assert_array_equal(batch.tokens, np.array(TOKENS, np.int32))
    assert batch.tokens.dtype == np.int32
    np.testing.assert_array_equal(batch.loss_mask, np.array(MASK, np.float32))
    np.testing.assert_array_equal(batch.gen_logp, np.array(GEN_LOGP, np.float32))
    np.testing.assert_array_equal(batch.staleness, np.array(STALENESS, np.int32))
    np.testing.assert_array_equal(batch.rewards, np.array(REWARDS, np.float32))
    np.testing.assert_array_equal(batch.truncated, np.array(TRUNCATED, np.float32))
    np.testing.assert_array_equal(batch.group_ids, np.array(GROUP_IDS, np.int32))
    np.testing.assert_allclose(batch.advantages, np.array(ADVANTAGES[normalization]), rtol=ADV_RTOL, atol=0)
    assert stats.n_groups == 3 and stats.n_kept_groups == 2 and stats.n_filtered_groups == 1
    assert stats.n_tokens == 3 + 4 + 7 + 2 + 2  # sampled tokens of the kept groups that fit their rows
    assert stats.min_version == 3  # row 1's first tokens; the cut-off version-1 tokens of row 2 do not count
    assert stats.max_staleness == 2
    # means over the 7 rows (float32 rewards, exact small values): 6 adds and a division, gamma_8 in float32
    assert stats.reward_mean == pytest.approx(1 / 7, rel=MEAN7) and stats.pass_rate == pytest.approx(4 / 7, rel=MEAN7)
    assert stats.truncation_rate == pytest.approx(2 / 7, rel=MEAN7)
    assert stats.interruption_rate == pytest.approx(2 / 7, rel=MEAN7)
    assert stats.completion_len_mean == pytest.approx((3 + 6 + 9 + 2 + 4 + 2 + 4) / 7, rel=MEAN7)


def test_without_zero_variance_filtering_the_group_stays_in_the_mask_with_zero_advantage():
    groups, rewards = groups_and_rewards()
    batch, stats = build_train_batch(groups, rewards, version=VERSION, seq_len=T, n_rows=ROWS, pad_id=PAD,
                                     loss_cfg=LossConfig(normalization="batch", filter_zero_variance=False))
    want_mask = np.array(MASK, np.float32)
    want_mask[5:7] = MASK_UNFILTERED_G2
    np.testing.assert_array_equal(batch.loss_mask, want_mask)
    np.testing.assert_allclose(batch.advantages, np.array(ADVANTAGES["batch"]), rtol=ADV_RTOL, atol=0)
    assert stats.n_tokens == 18 + 2 + 4


# ---- compacted batches (TrainConfig.row_buckets): the filtered group and the padding are left out ----------


def test_bucket_quantum_by_hand():
    from scalerl_jax.train.rl_batch import bucket_quantum

    assert bucket_quantum(256, 1, 8) == 0  # one bucket: no compaction
    assert bucket_quantum(256, 4, 8) == 64  # 256 / 4
    assert bucket_quantum(256, 8, 8) == 32
    assert bucket_quantum(256, 8, 48) == 48  # 32 rounded up to whole micro-batches x groups x shards
    assert bucket_quantum(10, 4, 4) == 4  # ceil(10 / 4) = 3, rounded up to 4


@pytest.mark.parametrize("normalization", ["batch", "prompt", "none"])
def test_a_compacted_batch_is_the_kept_groups_rows_padded_to_the_quantum(normalization):
    groups, rewards = groups_and_rewards()
    cfg = LossConfig(normalization=normalization, filter_zero_variance=True)
    batch, stats = build_train_batch(groups, rewards, version=VERSION, seq_len=T, n_rows=ROWS, pad_id=PAD,
                                     loss_cfg=cfg, row_quantum=2)
    # groups 0 and 1 (5 rows) are kept, group 2 is filtered: 5 rows round up to 6; row 5 is padding
    keep = [0, 1, 2, 3, 4]
    pad_row = np.array([[P] * T], np.int32)
    np.testing.assert_array_equal(batch.tokens, np.concatenate([np.array(TOKENS, np.int32)[keep], pad_row]))
    np.testing.assert_array_equal(batch.loss_mask, np.array(MASK, np.float32)[keep + [7]])
    np.testing.assert_array_equal(batch.gen_logp, np.array(GEN_LOGP, np.float32)[keep + [7]])
    np.testing.assert_array_equal(batch.staleness, np.array(STALENESS, np.int32)[keep + [7]])
    np.testing.assert_array_equal(batch.rewards, np.array(REWARDS, np.float32)[keep + [7]])
    np.testing.assert_array_equal(batch.truncated, np.array(TRUNCATED, np.float32)[keep + [7]])
    np.testing.assert_array_equal(batch.group_ids, np.array([0, 0, 1, 1, 1, 2], np.int32))
    # the advantages of the full batch: normalised over every completion, not over the rows that are left
    np.testing.assert_allclose(batch.advantages, np.array(ADVANTAGES[normalization])[keep + [7]], rtol=ADV_RTOL,
                               atol=0)
    # the stats are the full batch's (the filtered group still counts in rewards, lengths and versions)
    assert stats.n_groups == 3 and stats.n_filtered_groups == 1 and stats.n_tokens == 18
    assert stats.reward_mean == pytest.approx(1 / 7, rel=MEAN7)
    assert stats.truncation_rate == pytest.approx(2 / 7, rel=MEAN7)
    assert stats.min_version == 3 and stats.max_staleness == 2
    # a quantum as large as the batch gives the full row count; every group kept needs all 8 rows at quantum 4
    big, _ = build_train_batch(groups, rewards, version=VERSION, seq_len=T, n_rows=ROWS, pad_id=PAD, loss_cfg=cfg,
                               row_quantum=8)
    assert big.tokens.shape == (8, T)
    unfiltered, _ = build_train_batch(groups, rewards, version=VERSION, seq_len=T, n_rows=ROWS, pad_id=PAD,
                                      loss_cfg=LossConfig(normalization=normalization, filter_zero_variance=False),
                                      row_quantum=4)
    assert unfiltered.tokens.shape == (8, T)  # 7 real rows round up to 8: only padding could be left out
    np.testing.assert_array_equal(unfiltered.tokens, np.array(TOKENS, np.int32))


def test_a_compacted_batch_keeps_groups_inside_their_micro_batches():
    groups, rewards = groups_and_rewards()
    # group 0 (2 rows) and group 1 (3 rows) kept; 2 micro-batches of 4 rows would split group 1, so it is refused
    # exactly as a full batch whose groups straddle would be
    with pytest.raises(ValueError, match="straddles"):
        build_train_batch(groups, rewards, version=VERSION, seq_len=T, n_rows=ROWS, pad_id=PAD,
                          loss_cfg=LossConfig(filter_zero_variance=True), microbatches=2, row_quantum=4)
    # groups of two: each micro-batch holds whole groups and their ids are local to it
    g = [[comp([3], [8, 1], [-0.1, -0.2], [5, 5]), comp([3], [9, 1], [-0.3, -0.4], [5, 5])] for _ in range(4)]
    r = [np.array([1.0, -1.0]), np.array([1.0, 1.0]), np.array([-1.0, 1.0]), np.array([1.0, -1.0])]
    batch, _ = build_train_batch(g, r, version=VERSION, seq_len=T, n_rows=8, pad_id=PAD,
                                 loss_cfg=LossConfig(filter_zero_variance=True), microbatches=2, row_quantum=4)
    assert batch.tokens.shape == (8, T)  # 6 kept rows round up to 8 (the full batch)
    # kept groups 0, 2, 3 become 0, 1, 2 (j mod 4 rows per micro-batch); the padding rows take 3 and 4 mod 4 = 0,
    # distinct from group 2 in their micro-batch
    np.testing.assert_array_equal(batch.group_ids, [0, 0, 1, 1, 2, 2, 3, 0])
    np.testing.assert_array_equal(batch.rewards, [1, -1, -1, 1, 1, -1, 0, 0])


def test_the_loss_and_gradient_of_a_compacted_batch_are_the_full_batchs():
    """The RL loss of a model on the compacted batch against the same loss on the full batch (the arrays of the
    test above): equal up to float summation order, parameters' gradients included."""
    import jax

    from scalerl_jax.models import init_params
    from scalerl_jax.models.presets import tiny
    from scalerl_jax.train.rl import rl_loss

    cfg = dataclasses_replace(tiny(), max_seq_len=T, attn_chunk=T)
    params = init_params(cfg, jax.random.key(0), std=0.2)
    groups, rewards = groups_and_rewards()
    for kind, agg in (("cispo", "prompt"), ("dapo", "token"), ("gspo", "sample")):
        lcfg = LossConfig(kind=kind, aggregation=agg, filter_zero_variance=True)
        loss_fn = jax.value_and_grad(rl_loss(cfg, lcfg), has_aux=True)
        out = {}
        for q in (0, 2):
            batch, _ = build_train_batch(groups, rewards, version=VERSION, seq_len=T, n_rows=ROWS, pad_id=PAD,
                                         loss_cfg=lcfg, row_quantum=q)
            out[q] = loss_fn(params, batch.as_dict())
        (l_full, m_full), g_full = out[0]
        (l_cmp, m_cmp), g_cmp = out[2]
        assert abs(float(l_full)) > 1e-4  # a loss with something in it
        # two float32 orderings of the model's forward and backward pass over T positions (tests/tolerances.py):
        # the loss within `rel` of the sum of its terms' absolute values, a token's log-prob (and so its ratio's
        # log) within `rel` of the largest |log p|, the gradients within `rel` of their largest entries
        loss_scale, logp_max = rl_loss_scale(cfg, params, batch.as_dict())
        rel = model_rel(cfg, T, backward=True)
        assert abs(float(l_cmp) - float(l_full)) <= rel * loss_scale
        for k in ("n_tokens", "n_samples", "n_prompts", "staleness_max"):  # counts
            assert float(m_cmp[k]) == float(m_full[k]), k
        assert float(m_cmp["is_ratio_mean"]) == pytest.approx(float(m_full["is_ratio_mean"]),
                                                               rel=rel * logp_max + reorder_rel(ROWS * T))
        assert max_rel(g_cmp, g_full) <= rel


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_a_compacted_batch_takes_the_smallest_compiled_size_that_holds_it():
    groups, rewards = groups_and_rewards()
    cfg = LossConfig(filter_zero_variance=True)
    for sizes, want in (([], 8), ([4], 8), ([4, 6], 6), ([2, 4, 8], 8)):  # 5 kept rows: 6 by the quantum
        batch, stats = build_train_batch(groups, rewards, version=VERSION, seq_len=T, n_rows=ROWS, pad_id=PAD,
                                         loss_cfg=cfg, row_quantum=2, row_sizes=sizes)
        assert batch.tokens.shape[0] == want and stats.rows_wanted == 6, sizes
        np.testing.assert_array_equal(batch.tokens[:5], np.array(TOKENS, np.int32)[:5])
        assert (batch.tokens[5:] == PAD).all() and batch.loss_mask[5:].sum() == 0
