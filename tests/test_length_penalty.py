"""DAPO overlong shaping R_len(y) = clip((L_max - |y|)/L_cache - 1, -1, 0), added to correct traces only."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import LengthConfig
from scalerl_jax.rewards.length_penalty import length_penalty


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
    np.testing.assert_allclose(np.asarray(out), [1.0, 0.625, -1.0, 0.0], rtol=1e-6)
