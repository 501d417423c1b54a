"""DAPO overlong shaping R_len(y) = clip((L_max - |y|)/L_cache - 1, -1, 0), added to correct traces only."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import LengthConfig
from scalerl_jax.rewards.length_penalty import length_penalty
from tests.tolerances import ops


def test_hand_worked_numpy():
    # L_max = 14336, L_cache = 2048 (LengthConfig defaults); the ramp starts at 14336 - 2048 = 12288.
    #   |y| = 1000   -> (13336/2048 - 1) > 0         -> 0
    #   |y| = 12288  -> 2048/2048 - 1 = 0            -> 0
    #   |y| = 13312  -> 1024/2048 - 1 = -0.5         -> -0.5
    #   |y| = 14336  -> 0 - 1 = -1                   -> -1
    #   |y| = 20000  -> clipped                      -> -1
    cfg = LengthConfig()
    lengths = np.array([1000, 12288, 13312, 14336, 20000, 13312])
    correct = np.array([True, True, True, True, True, False])
    rewards = np.array([1.0, 1.0, 1.0, 1.0, 1.0, -1.0])
    out = length_penalty(rewards, lengths, correct, cfg.penalty_max_len, cfg.penalty_cache)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [1.0, 1.0, 0.5, 0.0, 0.0, -1.0])  # the incorrect trace keeps -1


def test_jax_and_jit():
    lengths = jnp.array([10, 15, 20, 30])
    correct = jnp.array([1, 1, 0, 1])
    rewards = jnp.array([1.0, 1.0, -1.0, 1.0])
    # L_max = 20, L_cache = 8: |y|=10 -> 0.25 -> 0; 15 -> 5/8 - 1 = -0.375; 20 (incorrect) -> unchanged; 30 -> -1.
    f = jax.jit(lambda r, l, c: length_penalty(r, l, c, 20, 8))
    out = f(rewards, lengths, correct)
    assert isinstance(out, jax.Array)
    # float32: a subtraction, a division and a clip from exact integers, and the addition to the reward
    np.testing.assert_allclose(np.asarray(out), [1.0, 0.625, -1.0, 0.0], rtol=ops(3), atol=0)


def test_producer_counts_the_samples_the_penalty_changed():
    """The rollout producer reports how many samples the shaping changed (the trainer logs it per step as
    length_penalty_rate): with L_max 10 and L_cache 4 the ramp starts after 6 tokens, so of the correct
    completions of 4 and 8 tokens only the 8-token one is docked, and wrong ones never."""
    from scalerl_jax.experiments.presets import build_plan
    from scalerl_jax.experiments.run_path import reward_transform

    from scalerl_jax.rollout.orchestrator import RolloutProducer
    from scalerl_jax.rollout.protocol import Completion, SamplingParams

    plan = build_plan("tiny_chain", "length_penalty")
    lc = dataclasses.replace(plan.exp.rollout.length, penalty_max_len=10, penalty_cache=4)
    exp = dataclasses.replace(plan.exp, rollout=dataclasses.replace(plan.exp.rollout, length=lc))
    lengths, correct = [4, 8, 8, 12], [True, True, False, False]

    class Scripted:  # a generator that returns fixed completions of the given lengths
        def generate(self, requests):
            return [[Completion(request_id="0", sample_index=k, prompt_ids=[2], token_ids=[3] * n,
                                logprobs=[0.0] * n, versions=[0] * n, injected=[False] * n, finish_reason="stop")
                     for k, n in enumerate(lengths)] for _ in requests]

    def score(texts, problems):
        return np.array([1.0 if c else -1.0 for c in correct], np.float32), {"timeouts": 0, "no_answer": 0}

    prod = RolloutProducer(Scripted(), None, encode=lambda s: [2], decode=lambda ids: "x", score=score,
                           sampling=SamplingParams(), prompts_per_batch=1, reward_transform=reward_transform(exp))
    from scalerl_jax.data.chain import chain_problem

    _, rewards, _, _, counts = prod.generate_and_score([chain_problem([1, 2, 3])])
    # by hand: |y| = 4 -> clip(6/4 - 1) = 0; |y| = 8 -> clip(2/4 - 1) = -0.5; wrong traces keep -1
    np.testing.assert_allclose(rewards[0], [1.0, 0.5, -1.0, -1.0], rtol=ops(3), atol=0)  # a division, two adds
    assert counts["length_penalized"] == 1
