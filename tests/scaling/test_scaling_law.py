"""The law, its helpers and the input checks, against values worked by hand."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.scaling import ScalingFitWarning, check_curve, efficiency_F, power_law_reward, sigmoid_reward
from scalerl_jax.scaling.law import power_law_D
from tests.tolerances import ops

# float64 closed forms against decimal hand values: a division, a power (exp and log), 1 +, a division, a product and
# a sum, no cancellation, and the hand value's own rounding to float64 (tests/tolerances.py)
LAW64 = ops(7, "float64", transcendental=2)


def test_sigmoid_reward_hand_values():
    # At C = C_mid half the gain is reached: 0.3 + 0.5 * (0.6 - 0.3) = 0.45.
    assert sigmoid_reward(100.0, 0.6, 2.0, 100.0, 0.3) == pytest.approx(0.45, rel=LAW64)
    # C = 2 C_mid, B = 2: (C_mid / C)^B = 1/4, so R = 0.3 + 0.3 / 1.25 = 0.54.
    assert sigmoid_reward(200.0, 0.6, 2.0, 100.0, 0.3) == pytest.approx(0.54, rel=LAW64)
    # Zero compute gives R0 exactly (no 0 ** -B overflow), huge compute approaches A (within (A - R0) 1e-20 of it).
    assert sigmoid_reward(0.0, 0.6, 2.0, 100.0, 0.3) == 0.3
    assert sigmoid_reward(1e12, 0.6, 2.0, 100.0, 0.3) == pytest.approx(0.6, rel=LAW64)


def test_sigmoid_reward_broadcasts_and_keeps_array_kind():
    c = np.array([0.0, 50.0, 100.0])
    A = np.array([[0.6], [0.8]])
    out = sigmoid_reward(c, A, 1.0, 100.0, 0.2)
    assert isinstance(out, np.ndarray) and out.shape == (2, 3)
    # C = C_mid / 2, B = 1: fraction 1 / (1 + 2) = 1/3.
    np.testing.assert_allclose(out[1], [0.2, 0.2 + 0.6 / 3, 0.5], rtol=2 * LAW64)  # float64 on both sides
    j = sigmoid_reward(jnp.asarray(c), 0.6, 1.0, 100.0, 0.2)
    assert not isinstance(j, np.ndarray)
    # float32 against float64 (tests/tolerances.py): a division, a power (exp and log), 1 +, a division, a product
    # and a sum, no cancellation
    np.testing.assert_allclose(np.asarray(j), out[0], rtol=ops(6, transcendental=2))


def test_power_law_is_the_large_compute_limit():
    A, B, C_mid, R0 = 0.61, 1.92, 2542.0, 0.3
    D = power_law_D(A, B, C_mid, R0)
    # (A - R0) C_mid^B in float64 on both sides; A - R0 = 0.61 - 0.3 cancels (relative error up to (0.61 + 0.3) / 0.31
    # of a rounding, 3), then a power (exp and log) and a product
    assert D == pytest.approx(0.31 * 2542.0**1.92, rel=2 * ops(3 + 1 + 1, "float64", transcendental=2))
    c = 1e3 * C_mid
    # A - (A - R0) x / (1 + x) against A - (A - R0) x, x = (C_mid / c)^B: they differ by (A - R0) x^2 / (1 + x)
    x = (C_mid / c) ** B
    assert power_law_reward(c, A, D, B) == pytest.approx(sigmoid_reward(c, A, B, C_mid, R0),
                                                         abs=(A - R0) * x**2 + ops(8, "float64", transcendental=2))


def test_efficiency_transform_is_c_to_the_b():
    A, B, C_mid, R0 = 0.61, 1.92, 2542.0, 0.3
    c = np.array([500.0, 2542.0, 9000.0])
    F = efficiency_F(sigmoid_reward(c, A, B, C_mid, R0), A, B, C_mid, R0)
    # float64 there and back: (A - R0) / (r - R0) - 1 = x cancels by (1 + x) / x (x = (C_mid / c)^B >= 0.088 here),
    # then a power of 1 / B (tests/tolerances.py)
    x = (C_mid / c) ** B
    np.testing.assert_allclose(F, c**B, rtol=float(ops(16, "float64", transcendental=4) * ((1 + x) / x).max() / B))
    # Outside (R0, A) F is undefined.
    assert np.isnan(efficiency_F(np.array([0.2, 0.7]), A, B, C_mid, R0)).all()


C5 = [0.0, 1.0, 2.0, 3.0, 4.0]
R5 = [0.3, 0.35, 0.4, 0.42, 0.43]


@pytest.mark.parametrize(
    "compute, reward, match",
    [
        (C5[:4], R5[:4], "at least 5"),
        ([0.0, 1.0, np.nan, 3.0, 4.0], R5, "non-finite"),
        (C5, [0.3, 0.35, np.inf, 0.42, 0.43], "non-finite"),
        (C5, [0.3, 0.35, 1.2, 0.42, 0.43], r"outside \[0, 1\]"),
        (C5, [-1.0, 1.0, -1.0, 1.0, 1.0], r"outside \[0, 1\]"),
        ([0.0, 1.0, 1.0, 3.0, 4.0], R5, "strictly increase"),
        ([0.0, 2.0, 1.0, 3.0, 4.0], R5, "strictly increase"),
        ([-1.0, 1.0, 2.0, 3.0, 4.0], R5, "negative"),
        (C5, R5[:4] + [0.4, 0.5], "has 5 points but reward has 6"),
    ],
)
def test_check_curve_rejects_bad_input(compute, reward, match):
    with pytest.raises(ValueError, match=match):
        check_curve(compute, reward)


def test_check_curve_warns_on_flat_curve():
    with pytest.warns(ScalingFitWarning, match="flat"):
        check_curve(C5, [0.4] * 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c, r = check_curve(C5, R5)
    assert c.dtype == np.float64 and r.tolist() == R5
