"""policy_loss: hand-worked examples, an independent NumPy re-derivation (loss and d loss / d logp), properties."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl_jax.config import LossConfig
from scalerl_jax.losses import policy_loss
from tests.tolerances import ops, sum_rel

# Tolerances (tests/tolerances.py): float32 against float64 values worked by hand or by the NumPy reference.
# A token's term: the log-ratio logp - gen (rounded, and carrying the inputs' own rounding to float32, u (|logp| +
# |gen|) <= 12 u for the hand values: the NumPy reference is given the float32-rounded inputs instead), its exp (whose
# relative error is the log-ratio's absolute one, <= |log rho| u with |log rho| <= 4 here, plus the approximation's),
# a clip and two products; GSPO's sequence mean adds T - 1 = 5 sums and a division; the aggregation two divisions by
# counts: 12 + 12 + 4 + 5 + 1 + 2 roundings and one exp at most.
TERM_REL = ops(36, transcendental=1)
# the loss sums at most B x T = 48 weighted terms: relative to the sum of their absolute values
LOSS_REL = TERM_REL + sum_rel(48)
# a metric is a mean (or max / min / fraction) over the 7 ratios: TERM_REL and a sum of 7
METRIC_REL = TERM_REL + sum_rel(7)

KINDS = ("cispo", "gspo", "dapo", "grpo")
AGGS = ("prompt", "sample", "token")
EPS = {"cispo": (0.2, 0.28), "dapo": (0.2, 0.28), "grpo": (0.2, 0.2), "gspo": (0.2, 0.28)}


def _cfg(kind, agg, eps_max=5.0):
    lo, hi = EPS[kind]
    return LossConfig(kind=kind, aggregation=agg, eps_low=lo, eps_high=hi, eps_max=eps_max)


_loss_and_grad = jax.jit(jax.value_and_grad(policy_loss, has_aux=True), static_argnums=5)


def run(logp, gen, adv, mask, gid, cfg):
    args = [jnp.asarray(x, jnp.float32) for x in (logp, gen, adv, mask)]
    (loss, metrics), grad = _loss_and_grad(*args, jnp.asarray(gid, jnp.int32), cfg)
    return float(loss), {k: float(v) for k, v in metrics.items()}, np.asarray(grad, np.float64)


# ---------------------------------------------------------------------------------------------------------------
# Hand-worked example. 4 completions, T = 3, groups [0, 0, 1, 2]; row 3 is a filtered (all-masked) row.
#   row 0: A=+1, mask [1,1,0], rho [2, 0.5],    logp [-1, -2]
#   row 1: A=-1, mask [1,1,0], rho [8, 0.5],    logp [-0.5, -1]
#   row 2: A=+2, mask [1,1,1], rho [1, 8, 0.5], logp [-1, -1, -1]
#   row 3: A=+5, mask [0,0,0] (must contribute nothing)
# Token counts: |y| = 2, 2, 3, 0; prompt tokens g0 = 4, g1 = 3; P = 2 prompts, S = 3 samples, N = 7 tokens.
# ---------------------------------------------------------------------------------------------------------------
LN = math.log
HAND_LOGP = np.array([[-1, -2, 0.3], [-0.5, -1, -7.0], [-1, -1, -1], [-3, 9.0, -2]])
HAND_LOGRATIO = np.array([[LN(2), LN(0.5), 4.0], [LN(8), LN(0.5), 0], [0, LN(8), LN(0.5)], [1, 2, 3.0]])
HAND_GEN = HAND_LOGP - HAND_LOGRATIO
HAND_ADV = np.array([1.0, -1.0, 2.0, 5.0])
HAND_MASK = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0]])
HAND_GID = np.array([0, 0, 1, 2])

# CISPO, l = -min(rho, 5) * A * logp:
#   row 0: -2*1*(-1) = 2,  -0.5*1*(-2) = 1                       sum  3
#   row 1: -5*(-1)*(-0.5) = -2.5,  -0.5*(-1)*(-1) = -0.5         sum -3
#   row 2: -1*2*(-1) = 2,  -5*2*(-1) = 10,  -0.5*2*(-1) = 1      sum 13
#   prompt: ((3 - 3)/4 + 13/3) / 2 = 13/6;  sample: (3/2 - 3/2 + 13/3) / 3 = 13/9;  token: 13/7
# DAPO, l = -min(rho*A, clip(rho, 0.8, 1.28)*A):
#   row 0 (A>0): rho 2 clipped -> -1.28;  rho 0.5 -> -0.5                      sum -1.78
#   row 1 (A<0): rho 8 not clipped -> 8;  rho 0.5 < 0.8 clipped -> 0.8          sum  8.8
#   row 2 (A=2): rho 1 -> -2;  rho 8 clipped -> -2.56;  rho 0.5 -> -1            sum -5.56
#   prompt: (7.02/4 - 5.56/3) / 2;  sample: (-1.78/2 + 8.8/2 - 5.56/3) / 3;  token: 1.46/7
# GRPO, clip(rho, 0.8, 1.2): row sums -1.7, 8.8, -5.4
#   prompt: (7.1/4 - 5.4/3) / 2 = -0.0125;  sample: (-0.85 + 4.4 - 1.8) / 3;  token: 1.7/7
# GSPO, s = exp(mean log rho), clip(s, 0.8, 1.28), every token carries its sequence's term:
#   row 0: s = sqrt(2 * 0.5) = 1 -> -1 per token;  row 1: s = sqrt(8 * 0.5) = 2, A<0 not clipped -> 2 per token
#   row 2: s = (1 * 8 * 0.5)^(1/3) = 4^(1/3) > 1.28, clipped -> -2.56 per token
#   prompt: ((-2 + 4)/4 - 2.56) / 2 = -1.03;  sample: (-1 + 2 - 2.56) / 3 = -0.52;  token: (-2 + 4 - 7.68)/7
HAND_LOSS = {
    ("cispo", "prompt"): 13 / 6,
    ("cispo", "sample"): 13 / 9,
    ("cispo", "token"): 13 / 7,
    ("dapo", "prompt"): (7.02 / 4 - 5.56 / 3) / 2,
    ("dapo", "sample"): (-1.78 / 2 + 8.8 / 2 - 5.56 / 3) / 3,
    ("dapo", "token"): 1.46 / 7,
    ("grpo", "prompt"): -0.0125,
    ("grpo", "sample"): (-0.85 + 4.4 - 1.8) / 3,
    ("grpo", "token"): 1.7 / 7,
    ("gspo", "prompt"): -1.03,
    ("gspo", "sample"): -0.52,
    ("gspo", "token"): -5.68 / 7,
}
# Gradients d loss / d logp worked by hand for one aggregation per kind (padding positions 0):
#   cispo/prompt, -min(rho,5)*A/(n_tok(g)*P): row 0 -2/8, -0.5/8; row 1 5/8, 0.5/8; row 2 -2/6, -10/6, -1/6
#   dapo/token, -rho*A/7 where unclipped: row 0 0, -0.5/7; row 1 8/7, 0; row 2 -2/7, 0, -1/7
#   gspo/sample, -s*A/(S*|y|): row 0 -1/6 each; row 1 2/6 each; row 2 clipped 0
HAND_GRAD = {
    ("cispo", "prompt"): [[-2 / 8, -0.5 / 8, 0], [5 / 8, 0.5 / 8, 0], [-2 / 6, -10 / 6, -1 / 6], [0, 0, 0]],
    ("dapo", "token"): [[0, -0.5 / 7, 0], [8 / 7, 0, 0], [-2 / 7, 0, -1 / 7], [0, 0, 0]],
    ("gspo", "sample"): [[-1 / 6, -1 / 6, 0], [2 / 6, 2 / 6, 0], [0, 0, 0], [0, 0, 0]],
}


@pytest.mark.parametrize("kind,agg", sorted(HAND_LOSS))
def test_hand_worked_loss(kind, agg):
    loss, metrics, grad = run(HAND_LOGP, HAND_GEN, HAND_ADV, HAND_MASK, HAND_GID, _cfg(kind, agg))
    scale = np_policy_loss(HAND_LOGP, HAND_GEN, HAND_ADV, HAND_MASK, HAND_GID, kind, agg, *EPS[kind], 5.0)[2]
    assert loss == pytest.approx(HAND_LOSS[kind, agg], rel=0, abs=LOSS_REL * scale)
    if (kind, agg) in HAND_GRAD:  # each entry one term: no sum
        np.testing.assert_allclose(grad, HAND_GRAD[kind, agg], rtol=TERM_REL, atol=0)
    # Token ratios 2, .5, 8, .5, 1, 8, .5: mean 20.5/7, max 8, min .5; above the cap 5: 2 of 7.
    assert metrics["is_ratio_mean"] == pytest.approx(20.5 / 7, rel=METRIC_REL)
    assert metrics["is_ratio_max"] == pytest.approx(8.0, rel=TERM_REL)
    assert metrics["is_ratio_min"] == pytest.approx(0.5, rel=TERM_REL)
    assert metrics["is_ratio_above_cap_frac"] == pytest.approx(2 / 7, rel=ops(1))  # a count over 7
    # sum rho^2 = 4 + .25 + 64 + .25 + 1 + 64 + .25 = 133.75; std = sqrt(E[rho^2] - E[rho]^2): the difference
    # cancels 19.1 - 8.6 (a factor 2), the square root halves the relative error
    assert metrics["is_ratio_std"] == pytest.approx(math.sqrt(133.75 / 7 - (20.5 / 7) ** 2),
                                                    rel=2 * (2 * METRIC_REL + ops(3)))
    # |log rho| = ln2, ln2, ln8, ln2, 0, ln8, ln2 = 10 ln2 over 7 tokens (the padded 4.0 and row 3 do not count);
    # the log-ratio's absolute error (the inputs' rounding, 12 u) over its size ln 2
    assert metrics["logp_diff_abs_mean"] == pytest.approx(10 * LN(2) / 7, rel=METRIC_REL + ops(12) / LN(2))
    assert metrics["seq_ratio_mean"] == pytest.approx((1 + 2 + 4 ** (1 / 3)) / 3, rel=METRIC_REL)
    assert (metrics["n_tokens"], metrics["n_samples"], metrics["n_prompts"]) == (7, 3, 2)
    # Clipped tokens: cispo rho > 5 (2 tokens); dapo/grpo row0 t0, row1 t1, row2 t1; gspo all of row 2.
    assert metrics["clip_frac"] == pytest.approx({"cispo": 2 / 7, "dapo": 3 / 7, "grpo": 3 / 7, "gspo": 3 / 7}[kind],
                                                 rel=ops(1))  # a count over 7


def test_hand_worked_metrics_all_masked():
    mask = np.zeros_like(HAND_MASK)
    loss, metrics, grad = run(HAND_LOGP, HAND_GEN, HAND_ADV, mask, HAND_GID, _cfg("cispo", "prompt"))
    assert loss == 0.0 and not grad.any()
    assert all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------------------------------------------------------
# Independent NumPy reference: explicit loops, float64, gradients derived by hand.
# ---------------------------------------------------------------------------------------------------------------
def np_policy_loss(logp, gen, adv, mask, gid, kind, agg, eps_low, eps_high, eps_max):
    B, T = logp.shape
    lengths = [int(mask[i].sum()) for i in range(B)]
    term = np.zeros((B, T))
    dterm = np.zeros((B, T))  # d term / d logp at that token, for the kinds whose term is per token
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t] > 0]
        if kind == "gspo":
            if not toks:
                continue
            s = math.exp(sum(logp[i, t] - gen[i, t] for t in toks) / len(toks))
            clipped = (adv[i] > 0 and s > 1 + eps_high) or (adv[i] < 0 and s < 1 - eps_low)
            seq_term = -(min(max(s, 1 - eps_low), 1 + eps_high) if clipped else s) * adv[i]
            for t in toks:
                term[i, t] = seq_term
            continue
        for t in toks:
            rho = math.exp(logp[i, t] - gen[i, t])
            if kind == "cispo":
                term[i, t] = -min(rho, eps_max) * adv[i] * logp[i, t]
                dterm[i, t] = -min(rho, eps_max) * adv[i]
            else:
                if adv[i] > 0 and rho > 1 + eps_high:
                    term[i, t], dterm[i, t] = -(1 + eps_high) * adv[i], 0.0
                elif adv[i] < 0 and rho < 1 - eps_low:
                    term[i, t], dterm[i, t] = -(1 - eps_low) * adv[i], 0.0
                else:
                    term[i, t], dterm[i, t] = -rho * adv[i], -rho * adv[i]
    # Per-token weights of the aggregation, by explicit counting.
    weight = np.zeros((B, T))
    if agg == "token":
        n = sum(lengths)
        for i in range(B):
            weight[i] = mask[i] / n if n else 0.0
    elif agg == "sample":
        live = [i for i in range(B) if lengths[i] > 0]
        for i in live:
            weight[i] = mask[i] / (lengths[i] * len(live))
    else:
        groups = {}
        for i in range(B):
            groups.setdefault(int(gid[i]), []).append(i)
        live = {g: rows for g, rows in groups.items() if sum(lengths[i] for i in rows) > 0}
        for rows in live.values():
            n_g = sum(lengths[i] for i in rows)
            for i in rows:
                weight[i] = mask[i] / (n_g * len(live))
    loss = float((term * weight).sum())
    scale = float(np.abs(term * weight).sum())  # what the loss's rounding is relative to (LOSS_REL)
    grad = np.zeros((B, T))
    if kind == "gspo":
        for i in range(B):
            toks = [t for t in range(T) if mask[i, t] > 0]
            if not toks:
                continue
            s = math.exp(sum(logp[i, t] - gen[i, t] for t in toks) / len(toks))
            clipped = (adv[i] > 0 and s > 1 + eps_high) or (adv[i] < 0 and s < 1 - eps_low)
            if not clipped:  # d(-s*A)/d logp_t = -s*A/|y|, times the sequence's total weight W_i
                grad[i, toks] = -s * adv[i] / len(toks) * weight[i].sum()
    else:
        grad = dterm * weight
    return loss, grad, scale


def random_batch(rng, B, T, n_groups, p_mask=0.7, ratio_scale=0.6):
    gid = rng.integers(0, n_groups, size=B)
    mask = (rng.random((B, T)) < p_mask).astype(np.float64)
    mask[rng.random(B) < 0.2] = 0.0  # some filtered rows
    logp = -rng.exponential(1.5, size=(B, T))
    gen = logp - rng.normal(0.0, ratio_scale, size=(B, T))
    gen[0, 0] = logp[0, 0] - math.log(9.0)  # a ratio far above eps_max
    mask[0, 0] = 1.0
    adv = rng.normal(size=B)
    return logp, gen, adv, mask, gid


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("agg", AGGS)
def test_matches_numpy_reference(kind, agg):
    rng = np.random.default_rng(hash((kind, agg)) % 2**32)
    cfg = _cfg(kind, agg)
    for B, T, n_groups in ((8, 6, 3), (4, 6, 4)):  # shapes shared with the property tests (one compile)
        # the reference sees the inputs as float32 holds them: only the computation's rounding is compared
        logp, gen, adv, mask, gid = (np.asarray(x, np.float32).astype(np.float64) if x.dtype.kind == "f" else x
                                     for x in random_batch(rng, B, T, n_groups))
        loss, _, grad = run(logp, gen, adv, mask, gid, cfg)
        ref_loss, ref_grad, scale = np_policy_loss(logp, gen, adv, mask, gid, kind, agg, cfg.eps_low, cfg.eps_high,
                                                   5.0)
        assert loss == pytest.approx(ref_loss, rel=0, abs=LOSS_REL * scale)
        # each entry one term (GSPO's carries its sequence's mean): no sum
        np.testing.assert_allclose(grad, ref_grad, rtol=TERM_REL, atol=0)


@pytest.mark.parametrize("agg", AGGS)
def test_cispo_gradient_exact_including_capped_tokens(agg):
    """d loss / d logp = -min(rho, eps_max) * A / N per token; capped tokens are scaled by eps_max, not zeroed."""
    rng = np.random.default_rng(7)
    B, T = 6, 4
    logp = -rng.exponential(1.0, size=(B, T))
    log_rho = np.log(rng.choice([0.3, 1.0, 4.0, 6.0, 50.0], size=(B, T)))
    gen = logp - log_rho
    mask = np.ones((B, T))
    mask[1, 2:] = 0
    mask[4] = 0
    gid = np.array([0, 0, 1, 1, 2, 2])
    adv = np.array([1.0, -1.0, 0.5, -2.0, 3.0, 1.0])
    _, _, grad = run(logp, gen, adv, mask, gid, _cfg("cispo", agg, eps_max=5.0))
    lengths = mask.sum(1)
    if agg == "token":
        n = np.full(B, lengths.sum())
    elif agg == "sample":
        n = lengths * (lengths > 0).sum()
    else:
        tok_g = np.array([lengths[gid == g].sum() for g in gid])
        n = tok_g * 3  # P = 3: prompt 2 still has row 5 although row 4 is fully masked
    expected = -np.minimum(np.exp(log_rho), 5.0) * adv[:, None] / np.maximum(n, 1)[:, None] * mask
    # one term per entry; the inputs' rounding to float32 (|logp| + |gen| <= 5 + 4 here: 9 u) is not in `expected`
    np.testing.assert_allclose(grad, expected, rtol=TERM_REL + ops(9), atol=0)
    capped = (np.exp(log_rho) > 5.0) & (mask > 0)
    assert capped.sum() > 0 and np.all(grad[capped] != 0)


# ---------------------------------------------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------------------------------------------
@st.composite
def batches(draw):
    B = draw(st.sampled_from([4, 8]))  # few distinct shapes: each new one recompiles; masks vary the real sizes
    T = 6
    seed = draw(st.integers(0, 2**31 - 1))
    n_groups = draw(st.integers(1, B))
    kind = draw(st.sampled_from(KINDS))
    agg = draw(st.sampled_from(AGGS))
    rng = np.random.default_rng(seed)
    return random_batch(rng, B, T, n_groups), _cfg(kind, agg), rng


PROP = settings(max_examples=25, deadline=None)


@PROP
@given(batches())
def test_padding_tokens_change_nothing(data):
    (logp, gen, adv, mask, gid), cfg, rng = data
    loss, metrics, grad = run(logp, gen, adv, mask, gid, cfg)
    off = mask == 0
    logp2, gen2 = logp.copy(), gen.copy()
    logp2[off] = rng.choice([-1e4, 0.0, 30.0, -np.inf], size=off.sum())
    gen2[off] = rng.choice([-1e4, 0.0, -30.0, 5.0], size=off.sum())
    loss2, metrics2, grad2 = run(logp2, gen2, adv, mask, gid, cfg)
    assert loss2 == loss and metrics2 == metrics
    np.testing.assert_array_equal(grad2, grad)
    assert not grad[off].any()


@PROP
@given(batches())
def test_permuting_groups_changes_nothing(data):
    (logp, gen, adv, mask, gid), cfg, rng = data
    B = len(gid)
    perm = rng.permutation(B)
    relabel = rng.permutation(B)  # group ids are any ints in [0, B)
    loss, metrics, grad = run(logp, gen, adv, mask, gid, cfg)
    loss2, metrics2, grad2 = run(logp[perm], gen[perm], adv[perm], mask[perm], relabel[gid[perm]], cfg)
    # the same float32 terms summed in another order: twice the bound of each, relative to the sum of the absolute
    # values (the loss: its weighted terms, from the NumPy reference; a metric: a mean over at most 48 tokens of
    # values no larger than the largest ratio)
    scale = np_policy_loss(logp, gen, adv, mask, gid, cfg.kind, cfg.aggregation, cfg.eps_low, cfg.eps_high, 5.0)[2]
    assert loss2 == pytest.approx(loss, rel=0, abs=2 * LOSS_REL * scale)
    for k in metrics:
        big = max(1.0, abs(metrics[k]), metrics["is_ratio_max"])
        assert metrics2[k] == pytest.approx(metrics[k], rel=0, abs=2 * (TERM_REL + sum_rel(48)) * big), k
    np.testing.assert_allclose(grad2, grad[perm], rtol=2 * TERM_REL, atol=0)


@PROP
@given(batches())
def test_zero_advantages_zero_gradient(data):
    (logp, gen, adv, mask, gid), cfg, _ = data
    loss, _, grad = run(logp, gen, np.zeros_like(adv), mask, gid, cfg)
    assert loss == 0.0
    assert not grad.any()


@PROP
@given(st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=4), min_size=1, max_size=4), st.integers(0, 999))
def test_prompt_aggregation_weights_prompts_equally(lengths_per_prompt, seed):
    """Each prompt's tokens carry total weight 1/P whatever its completions' lengths: with CISPO the weight of a
    token is grad / (-min(rho, eps_max) * A)."""
    rng = np.random.default_rng(seed)
    rows = [(g, n) for g, ls in enumerate(lengths_per_prompt) for n in ls]
    rows += [(0, 0)] * (16 - len(rows))  # pad to a fixed [16, 9] with fully masked rows
    B, T, P = 16, 9, len(lengths_per_prompt)
    mask = np.zeros((B, T))
    for i, (_, n) in enumerate(rows):
        mask[i, :n] = 1
    gid = np.array([g for g, _ in rows])
    logp = -rng.exponential(1.0, size=(B, T))
    gen = logp - rng.normal(0, 0.5, size=(B, T))
    adv = rng.choice([-1.5, 1.0, 2.0], size=B)
    _, _, grad = run(logp, gen, adv, mask, gid, _cfg("cispo", "prompt"))
    w = grad / (-np.minimum(np.exp(logp - gen), 5.0) * adv[:, None])
    assert not w[mask == 0].any()
    for g in range(P):  # the gradient's own rounding (TERM_REL) and this division and sum over <= 36 positive terms
        assert w[gid == g].sum() == pytest.approx(1 / P, rel=TERM_REL + ops(2) + sum_rel(36, "float64"))
    # Equivalently: a constant per-token term c_g = -A_g * logp contributes c_g / P, however long the prompt is.
    c = rng.normal(size=P)
    adv_c = c[gid]
    loss, _, _ = run(-np.ones((B, T)), -np.ones((B, T)), adv_c, mask, gid, _cfg("cispo", "prompt"))
    # rho = 1 exactly; the c_g (rounded to float32) summed over the tokens of 16 rows: relative to sum |c_g| / P
    assert loss == pytest.approx(c.sum() / P, rel=0, abs=(LOSS_REL + ops(1)) * float(np.abs(c).sum()) / P)


def test_jit_and_unknown_kind():
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        LossConfig(kind="ppo")
    logp, gen, adv, mask, gid = random_batch(np.random.default_rng(0), 4, 3, 2)
    loss, metrics = jax.jit(policy_loss, static_argnums=5)(
        jnp.asarray(logp, jnp.float32),
        jnp.asarray(gen, jnp.float32),
        jnp.asarray(adv, jnp.float32),
        jnp.asarray(mask, jnp.float32),
        jnp.asarray(gid),
        LossConfig(),
    )
    assert np.isfinite(float(loss)) and set(metrics) >= {"clip_frac", "is_ratio_mean", "is_ratio_above_cap_frac"}
