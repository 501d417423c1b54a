"""compute_advantages: hand-worked examples and NumPy formulas on random uneven groups."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl_jax.losses import compute_advantages
from scalerl_jax.losses.advantages import EPS
from tests.tolerances import ops

_jitted = jax.jit(compute_advantages, static_argnums=2)


def adv(rewards, gid, norm):
    a, k = _jitted(jnp.asarray(rewards, jnp.float32), jnp.asarray(gid, jnp.int32), norm)
    return np.asarray(a, np.float64), np.asarray(k)


# Groups: g0 = [1, -1, 1, 1] (mean 0.5), g1 = [1, 1] (zero variance), g2 = [-1, 1] (mean 0), g3 = [-1] (one sample).
R = [1, -1, 1, 1, 1, 1, -1, 1, -1]
G = [0, 0, 0, 0, 1, 1, 2, 2, 3]


# float32 against the float64 hand values (tests/tolerances.py): a group mean (at most 8 additions and a division),
# the centring, a variance (squares, at most 8 additions, a division) and its square root, + EPS and the division:
# 22 roundings, doubled for the centring's cancellation; and EPS itself, which the hand values leave out (EPS / std,
# every std here >= sqrt(0.75))
HAND_RTOL = ops(2 * 22) + EPS / math.sqrt(0.75)


def test_hand_worked():
    # Ahat: g0 -> [0.5, -1.5, 0.5, 0.5]; g2 -> [-1, 1]; g1, g3 dropped (keep False, A = 0).
    keep = [True, True, True, True, False, False, True, True, False]
    a, k = adv(R, G, "none")
    np.testing.assert_array_equal(k, keep)
    np.testing.assert_allclose(a, [0.5, -1.5, 0.5, 0.5, 0, 0, -1, 1, 0], rtol=HAND_RTOL, atol=0)
    # prompt: g0 reward std = sqrt((3*0.25 + 2.25)/4) = sqrt(0.75); g2 std = 1.
    s0 = math.sqrt(0.75)
    a, _ = adv(R, G, "prompt")
    np.testing.assert_allclose(a, [0.5 / s0, -1.5 / s0, 0.5 / s0, 0.5 / s0, 0, 0, -1, 1, 0], rtol=HAND_RTOL, atol=0)
    # batch: kept Ahat = [0.5, -1.5, 0.5, 0.5, -1, 1], mean 0, var = (0.75 + 2.25 + 2)/6 = 5/6.
    sb = math.sqrt(5 / 6)
    a, _ = adv(R, G, "batch")
    np.testing.assert_allclose(a, [0.5 / sb, -1.5 / sb, 0.5 / sb, 0.5 / sb, 0, 0, -1 / sb, 1 / sb, 0], rtol=HAND_RTOL,
                               atol=0)


def test_all_zero_variance_is_finite():
    a, k = adv([1, 1, -1, -1], [0, 0, 1, 1], "batch")
    assert not k.any() and not a.any()


def np_advantages(r, gid, norm):
    """Per-group loops in float64 (population std); also each element's divisor (std + EPS, or 1)."""
    a = np.zeros(len(r))
    keep = np.zeros(len(r), bool)
    div = np.ones(len(r))
    for g in set(gid.tolist()):
        idx = np.where(gid == g)[0]
        rg = r[idx]
        keep[idx] = rg.max() != rg.min()
        a[idx] = rg - rg.mean()
        if norm == "prompt":
            div[idx] = rg.std() + EPS
            a[idx] /= div[idx]
    if norm == "batch" and keep.any():
        div[keep] = a[keep].std() + EPS
        a[keep] /= div[keep]
    a[~keep] = 0.0
    return a, keep, div


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=6),
    st.sampled_from(["batch", "prompt", "none"]),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_matches_formulas_uneven_groups(sizes, norm, binary, seed):
    rng = np.random.default_rng(seed)
    B = 16  # fixed shape (one compile per mode); unused slots form their own (dropped) singleton groups
    labels = rng.permutation(B)[: len(sizes)]
    gid = np.concatenate([np.full(n, labels[j]) for j, n in enumerate(sizes)])
    n = len(gid)
    free = np.setdiff1d(np.arange(B), labels)[: B - n]
    gid = np.concatenate([gid, free])
    r = rng.choice([-1.0, 1.0], size=B) if binary else np.round(rng.normal(size=B), 1)
    r[rng.random(B) < 0.2] = 1.0
    perm = rng.permutation(B)
    gid, r = gid[perm], r[perm]
    a, k = adv(r, gid, norm)
    r = np.asarray(r, np.float32).astype(np.float64)  # the rewards as float32 holds them (0.1 is not exact there)
    ref_a, ref_k, div = np_advantages(r, gid, norm)
    np.testing.assert_array_equal(k, ref_k)
    # float32's rounding (tests/tolerances.py): a centred value carries the group sum's error (at most 16 terms, a
    # division, the subtraction; the batch std centres once more), e_c <= gamma_34 max|r|, absolute; the std's
    # relative error is at most e_c / std (the centred values' errors through the sum of squares) plus its own 20
    # roundings; A = centred / (std + EPS) adds both
    e_c = ops(34) * float(np.abs(r).max())
    std = np.maximum(div - EPS, EPS) if norm != "none" else np.full_like(div, np.inf)
    bound = e_c / div + np.abs(ref_a) * (e_c / std + ops(20))
    assert np.all(np.abs(a - ref_a) <= bound), (np.abs(a - ref_a) - bound).max()
    # Zero-variance groups are exactly the dropped ones.
    for g in np.unique(gid):
        rg = r[gid == g]
        assert k[gid == g].all() == (len(set(rg.tolist())) > 1)
        assert k[gid == g].all() or k[gid == g].sum() == 0


def test_unknown_mode():
    with pytest.raises(ValueError):
        compute_advantages(jnp.zeros(2), jnp.zeros(2, jnp.int32), "group")
