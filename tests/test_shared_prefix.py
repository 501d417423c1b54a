"""The train step that computes each group's prompt once (scalerl_jax/models/shared_prefix.py, the split layout of
scalerl_jax/train/rl_batch.py): the layout worked by hand, and one RL train step against the same step on the
plain rows (every row its own prompt + completion) for Llama, Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms),
with prompts of different lengths, interrupted completions, a filtered group, padding rows and micro-batches."""

import dataclasses

import jax
import numpy as np
import pytest

from scalerl_jax.config import LossConfig, TrainConfig
from scalerl_jax.models import init_params, shared_prefix
from scalerl_jax.models.presets import tiny, tiny_moe
from scalerl_jax.rollout.protocol import Completion
from scalerl_jax.train.optim import make_optimizer
from scalerl_jax.train.rl import rl_loss
from scalerl_jax.train.rl_batch import build_train_batch
from scalerl_jax.train.step import init_train_state, make_train_step
from tests.tolerances import check_train_steps

PAD = 0
LR = 1e-2


def _completion(prompt, tokens, injected=None, version=0):
    injected = injected or [False] * len(tokens)
    return Completion(request_id="r", sample_index=0, prompt_ids=list(prompt), token_ids=list(tokens),
                      logprobs=[0.0 if i else -1.0 - 0.1 * j for j, i in enumerate(injected)],
                      versions=[-1 if i else version for i in injected], injected=list(injected),
                      finish_reason="stop")


def test_split_layout_by_hand():
    groups = [[_completion([3, 4, 5], [6, 7]), _completion([3, 4, 5], [8])],
              [_completion([9], [10, 11, 12], injected=[False, True, False]), _completion([9], [13, 14, 15])]]
    rewards = [np.array([1.0, -1.0]), np.array([1.0, -1.0])]
    batch, _ = build_train_batch(groups, rewards, version=2, loss_cfg=LossConfig(), seq_len=7, n_rows=6, pad_id=PAD,
                                 prompt_cols=4, group_size=2)
    # prompts from column 0, completions from column 4 whatever the prompt's length; two padding rows
    np.testing.assert_array_equal(batch.tokens, [[3, 4, 5, 0, 6, 7, 0], [3, 4, 5, 0, 8, 0, 0],
                                                 [9, 0, 0, 0, 10, 11, 12], [9, 0, 0, 0, 13, 14, 15],
                                                 [0] * 7, [0] * 7])
    np.testing.assert_array_equal(batch.prompt_len, [3, 3, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch.loss_mask, [[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 0, 0],
                                                    [0, 0, 0, 0, 1, 0, 1], [0, 0, 0, 0, 1, 1, 1],
                                                    [0] * 7, [0] * 7])
    np.testing.assert_allclose(batch.gen_logp[2, 4:], [-1.0, 0.0, -1.2])
    # the plain layout of the same groups: each completion right after its prompt
    plain, _ = build_train_batch(groups, rewards, version=2, loss_cfg=LossConfig(), seq_len=7, n_rows=6, pad_id=PAD)
    np.testing.assert_array_equal(plain.tokens[2], [9, 10, 11, 12, 0, 0, 0])
    np.testing.assert_array_equal(plain.prompt_len, [3, 3, 1, 1, 0, 0])
    with pytest.raises(ValueError, match="group 0 has 2 completions, the split layout needs 3"):
        build_train_batch(groups, rewards, version=2, loss_cfg=LossConfig(), seq_len=7, n_rows=6, pad_id=PAD,
                          prompt_cols=4, group_size=3)
    with pytest.raises(ValueError, match="a prompt of 3 tokens does not fit prompt_cols=2"):
        build_train_batch(groups, rewards, version=2, loss_cfg=LossConfig(), seq_len=7, n_rows=6, pad_id=PAD,
                          prompt_cols=2, group_size=2)


def _groups(vocab, rng, n_groups=5, n=4, prompt_cols=9, new=7):
    """Groups of n completions of one prompt each: prompts of 2..prompt_cols tokens, completions of 1..new tokens
    (some interrupted), rewards mixed except in group 1 (all equal: filtered)."""
    groups, rewards = [], []
    for g in range(n_groups):
        prompt = rng.randint(1, vocab, rng.randint(2, prompt_cols + 1)).tolist()
        group = []
        for _ in range(n):
            k = rng.randint(1, new + 1)
            inj = [bool(x) for x in rng.rand(k) < 0.2]
            group.append(_completion(prompt, rng.randint(1, vocab, k).tolist(), injected=inj))
        groups.append(group)
        rewards.append(np.ones(n) if g == 1 else rng.choice([-1.0, 1.0], n))
    return groups, rewards


#: the suite runs two of the six cases (Llama whole, Qwen3 in micro-batches); CI's extended checks the other four
_EXT = pytest.mark.extended


@pytest.mark.parametrize("arch,microbatches", [
    ("llama", 1), ("qwen3", 2), pytest.param("llama", 2, marks=_EXT), pytest.param("qwen2", 1, marks=_EXT),
    pytest.param("qwen2", 2, marks=_EXT), pytest.param("qwen3", 1, marks=_EXT)])
def test_shared_prefix_train_step_equals_the_plain_rows(arch, microbatches):
    cfg = dataclasses.replace(tiny(), arch=arch, n_layers=2, max_seq_len=32, attn_chunk=32)
    assert (cfg.qkv_bias, cfg.head_qk_norm) == (arch == "qwen2", arch == "qwen3")
    P, new, n = 9, 7, 4
    rng = np.random.RandomState({"llama": 0, "qwen2": 1, "qwen3": 2}[arch])
    groups, rewards = _groups(cfg.vocab_size, rng, prompt_cols=P, new=new, n=n)
    kw = dict(version=0, loss_cfg=LossConfig(), seq_len=P + new, n_rows=32, pad_id=PAD, microbatches=microbatches)
    plain, _ = build_train_batch(groups, rewards, **kw)
    split, _ = build_train_batch(groups, rewards, **kw, prompt_cols=P, group_size=n)
    assert shared_prefix.supported(cfg, P + new) is None
    params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(3), std=0.1))
    if arch == "qwen2":  # biases start at zero: give them values so that they take part
        params["layers"]["bq"] = rng.normal(0, 0.1, params["layers"]["bq"].shape).astype(np.float32)
        params["layers"]["bk"] = rng.normal(0, 0.1, params["layers"]["bk"].shape).astype(np.float32)
    # adam_eps=1, no weight decay: the update is a monotone map of each gradient entry (tests/tolerances.py)
    opt = make_optimizer(TrainConfig(lr=LR, warmup_steps=0, weight_decay=0.0, adam_eps=1.0))
    out = {}
    for name, batch, layout in (("plain", plain, None), ("shared", split, (P, n))):
        step = jax.jit(make_train_step(rl_loss(cfg, LossConfig(), shared_prefix=layout), opt, microbatches))
        state, m = step(init_train_state(params, opt), batch.as_dict())
        assert int(m["skipped"]) == 0
        deltas = jax.tree.map(lambda new, old: np.asarray(new) - old, state.params, params)
        out[name] = ([float(m[k]) for k in ("loss", "entropy", "grad_norm")], jax.tree.leaves(deltas))
        out[name + "_tokens"] = float(m["n_tokens"]) if "n_tokens" in m else None
    m_r = out["plain"][0]
    assert abs(m_r[0]) > 1e-3 and m_r[2] > 1e-3  # a real loss and gradient, not a filtered-out batch
    assert out["plain_tokens"] == out["shared_tokens"]
    # two float32 orderings of one train step (tests/tolerances.py); the reference batch is the plain one
    check_train_steps(cfg, params, plain.as_dict(), out["plain"], out["shared"], lr=LR)


def test_unsupported_models_say_why():
    assert "arch='llama4'" in shared_prefix.supported(tiny_moe(), 40)
    assert "remat=True" in shared_prefix.supported(dataclasses.replace(tiny(), remat=True), 40)
    assert "attn_chunk=64" in shared_prefix.supported(tiny(), 65)
    assert shared_prefix.supported(tiny(), 64) is None
