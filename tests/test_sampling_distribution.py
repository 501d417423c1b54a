"""Sampling against its definition: empirical token frequencies of ``sample_tokens`` (the function the engine's
decode step calls) and of a one-token generation through ``JaxEngine`` match the renormalised top-p-truncated
``softmax(logits / T)``, computed by hand (literal numbers) or with NumPy in float64.

How the frequency checks are bounded (``tv_bound``). For N independent draws from p, the empirical distribution
p_hat has total-variation distance TV = 1/2 sum_v |p_hat_v - p_v|, and

    E[TV] <= 1/2 sum_v sqrt(p_v (1 - p_v) / N)          (Jensen: E|X| <= sqrt(E X^2), Var p_hat_v = p_v(1-p_v)/N)
    P(TV > E[TV] + t) <= exp(-2 N t^2)                  (McDiarmid: one draw moves TV by at most 1/N)

so ``bound = 1/2 sum_v sqrt(p_v (1 - p_v) / N) + sqrt(ln(1/delta) / (2 N))`` is exceeded with probability below
delta (1e-6 here) when the sampler is right. For the 6-token vocabulary and N = 100,000 draws per row
configuration the bound is at most 0.0035 + 0.0083 ~= 0.012 (the first term is ~1.8e-3 for the untruncated rows,
and the typical TV, ~0.8 x the first term for a normal approximation, is ~1.5e-3). A wrong sampler draws from
some q != p; then TV(p_hat, p) >= TV(p, q) - TV(p_hat, q), and TV(p_hat, q) is itself below the bound computed
for q with probability 1 - delta. So every test that checks a wrong candidate q is at least twice the bound away
from p (asserted below for the main mutation: top-p mask dropped) fails on that wrong sampler with probability
above 1 - delta, and passes on the right one with probability above 1 - delta.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.models import forward, init_params, tiny
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.engine.sampling import sample_tokens, top_p_mask
from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams
from tests.tolerances import logsoftmax_err, model_logprob_tol, ops

DELTA = 1e-6  # per-check false-failure probability of tv_bound


def tv(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())


def tv_bound(p: np.ndarray, n: int, delta: float = DELTA) -> float:
    """TV(empirical of n draws from p, p) stays below this with probability >= 1 - delta (module docstring)."""
    p = np.asarray(p, np.float64)
    return 0.5 * float(np.sqrt(p * (1 - p) / n).sum()) + math.sqrt(math.log(1 / delta) / (2 * n))


def freqs(tokens: np.ndarray, V: int) -> np.ndarray:
    return np.bincount(np.asarray(tokens).ravel(), minlength=V) / np.asarray(tokens).size


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def np_top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    """Reference truncation in float64: keep the most probable tokens while the mass strictly before them is below
    top_p (so the token that crosses the threshold is kept, and equal probabilities are kept together), renormalise."""
    p = np.asarray(p, np.float64)
    keep = np.array([p[p > pv].sum() < top_p for pv in p]) | (top_p >= 1.0)
    out = np.where(keep, p, 0.0)
    return out / out.sum()


# ---- sample_tokens on a fixed 6-token vocabulary -----------------------------------------------------------------

# Token probabilities q at temperature 2, in a shuffled vocabulary order (so a mask computed in sorted order but not
# mapped back to token ids would be caught). The logits are 2 log q, so softmax(logits / 2) = q exactly and
# softmax(logits / T) = q^(2/T) / sum(q^(2/T)).
Q = np.array([0.10, 0.40, 0.04, 0.25, 0.06, 0.15])  # sorted: 0.40 (1), 0.25 (3), 0.15 (5), 0.10 (0), 0.06 (4), 0.04 (2)
LOGITS = 2.0 * np.log(Q)
V = len(Q)
_Q2 = Q**2 / (Q**2).sum()  # T = 1
_SQ = np.sqrt(Q) / np.sqrt(Q).sum()  # T = 4

# (temperature, top_p, expected distribution written out by hand from Q)
CONFIGS = [
    # T = 2: the distribution is Q itself
    (2.0, 1.0, Q),
    # top_p 0.5: mass before 0.40 is 0 (kept), before 0.25 is 0.40 < 0.5 (kept: it crosses 0.5), before 0.15 is 0.65
    (2.0, 0.5, np.array([0, 0.40, 0, 0.25, 0, 0]) / 0.65),
    # top_p 0.7: 0.15 has 0.65 < 0.7 before it and crosses to 0.80: kept; 0.10 has 0.80 before it: dropped
    (2.0, 0.7, np.array([0, 0.5, 0, 0.3125, 0, 0.1875])),
    # top_p 0.05: only the most probable token (it is always kept)
    (2.0, 0.05, np.array([0, 1.0, 0, 0, 0, 0])),
    # T = 1: q^2 / 0.2602 = (0.6149, 0.2402, 0.0865, ...) sorted; top_p 0.7 keeps 0.6149 and the crossing 0.2402
    (1.0, 1.0, _Q2),
    (1.0, 0.7, np.array([0, 0.16, 0, 0.0625, 0, 0]) / 0.2225),
    # T = 4: sqrt(q) / 2.2809 = (0.2773, 0.2192, 0.1698, 0.1386, 0.1074, 0.0877) sorted, mass before the fifth is
    # 0.8049 < 0.9 (kept, crosses to 0.9123), before the sixth 0.9123 (dropped)
    (4.0, 0.9, np.where(np.arange(V) == 2, 0.0, _SQ) / (1 - _SQ[2])),
    # T = 0: greedy, whatever top_p says; the argmax is token 1
    (0.0, 1.0, np.array([0, 1.0, 0, 0, 0, 0])),
    (0.0, 0.3, np.array([0, 1.0, 0, 0, 0, 0])),
]
N_DRAWS = 100_000  # per configuration


def _batch(n: int):
    """All configurations interleaved in one batch of len(CONFIGS) * n rows (config c at rows c, c + C, ...)."""
    C = len(CONFIGS)
    temp = np.tile(np.array([c[0] for c in CONFIGS], np.float32), n)
    top_p = np.tile(np.array([c[1] for c in CONFIGS], np.float32), n)
    logits = np.broadcast_to(LOGITS.astype(np.float32), (C * n, V))
    return jnp.asarray(logits), jnp.asarray(temp), jnp.asarray(top_p)


_sample_jit = jax.jit(sample_tokens, static_argnames=("use_top_p",))


def test_reference_truncation_matches_the_hand_written_distributions():
    """The NumPy reference used for the engine check agrees with the literal distributions above."""
    for T, top_p, want in CONFIGS:
        if T > 0:
            p = np.exp(np_log_softmax(LOGITS / T))
            # float64 on both sides: a softmax of 6 terms, a truncation's sum and a division (tests/tolerances.py)
            np.testing.assert_allclose(np_top_p(p, top_p), want, rtol=0, atol=ops(16, "float64", transcendental=2),
                                       err_msg=f"T={T} top_p={top_p}")


@pytest.mark.parametrize("key_kind", ["batch", "per_row_raw", "per_row_typed"])
def test_sampled_frequencies_and_logprobs_match_the_truncated_tempered_softmax(key_kind):
    C, n = len(CONFIGS), N_DRAWS
    logits, temp, top_p = _batch(n)
    if key_kind == "batch":
        key = jax.random.PRNGKey(0)
    elif key_kind == "per_row_raw":
        key = jax.random.split(jax.random.PRNGKey(1), C * n)  # uint32 [B, 2]
    else:
        key = jax.random.split(jax.random.key(2), C * n)  # typed [B]
    tok, logp = jax.device_get(_sample_jit(logits, temp, top_p, key, use_top_p=True))
    assert tok.shape == (C * n,) and tok.dtype == np.int32 and logp.dtype == np.float32
    tok_nC, logp_nC = tok.reshape(n, C), logp.reshape(n, C)
    for c, (T, p, want) in enumerate(CONFIGS):
        emp = freqs(tok_nC[:, c], V)
        bound = tv_bound(want, n)
        assert tv(emp, want) < bound, f"T={T} top_p={p}: empirical {np.round(emp, 4)} vs {np.round(want, 4)}"
        # recorded log-prob: log_softmax(logits / T) of the drawn token, before truncation (log_softmax(logits)
        # for greedy rows)
        ref_lp = np_log_softmax(LOGITS / (T if T > 0 else 1.0))
        # float32 against float64 (tests/tolerances.py): the logits carry their rounding to float32 and the
        # division by T, then the log-softmax's own
        z = np.abs(LOGITS) / (T if T > 0 else 1.0)
        np.testing.assert_allclose(logp_nC[:, c], ref_lp[tok_nC[:, c]], rtol=0, atol=float(logsoftmax_err(ops(2) * z)),
                                   err_msg=f"T={T} top_p={p}")
    # teeth: dropping the top-p mask draws softmax(logits / T) untruncated, at least twice the bound away
    for T, p, want in CONFIGS:
        if T > 0 and p < 1:
            full = np.exp(np_log_softmax(LOGITS / T))
            assert tv(full, want) > 2 * (tv_bound(want, n) + tv_bound(full, n)), (T, p)


def test_top_p_one_and_one_half_give_measurably_different_distributions():
    n = 50_000
    logits = jnp.asarray(np.broadcast_to(LOGITS.astype(np.float32), (2 * n, V)))
    temp = jnp.full((2 * n,), 2.0, jnp.float32)
    top_p = jnp.asarray(np.repeat(np.array([1.0, 0.5], np.float32), n))
    tok = np.asarray(_sample_jit(logits, temp, top_p, jax.random.PRNGKey(3), use_top_p=True)[0])
    f_full, f_half = freqs(tok[:n], V), freqs(tok[n:], V)
    # true TV(Q, Q truncated at 0.5) = 0.35; each empirical is within ~0.017 of its own with prob 1 - 1e-6
    assert tv(f_full, f_half) > 0.3
    assert f_half[[0, 2, 4, 5]].sum() == 0.0  # tokens outside the top-0.5 nucleus are never drawn
    assert f_full[[0, 2, 4, 5]].sum() > 0.3  # ... and are drawn when top_p = 1 (their mass is 0.35)


def test_top_p_tie_at_the_threshold_keeps_all_tied_tokens():
    # probabilities 0.2, 0.1, 0.4, 0.1, 0.2: sorted 0.4, 0.2, 0.2, ...; top_p 0.5: the first 0.2 crosses the
    # threshold (0.4 before it) and is kept; the second 0.2 has 0.6 before it but the same probability, so it is
    # kept too (which of two equal tokens is "first" is arbitrary); renormalised: 0.25, 0, 0.5, 0, 0.25
    probs = np.array([0.2, 0.1, 0.4, 0.1, 0.2])
    lg = np.log(probs).astype(np.float32)
    mask = np.asarray(top_p_mask(jnp.asarray(lg[None]), jnp.asarray([0.5], jnp.float32)))[0]
    assert mask.tolist() == [True, False, True, False, True]
    # top_p 0.85: the first 0.1 crosses the threshold (0.8 before it) and the second 0.1 ties with it: all five kept
    mask = np.asarray(top_p_mask(jnp.asarray(lg[None]), jnp.asarray([0.85], jnp.float32)))[0]
    assert mask.tolist() == [True] * 5
    n = 60_000
    tok = np.asarray(_sample_jit(jnp.asarray(np.broadcast_to(lg, (n, 5))), jnp.ones((n,), jnp.float32),
                                 jnp.full((n,), 0.5, jnp.float32), jax.random.PRNGKey(4), use_top_p=True)[0])
    want = np.array([0.25, 0.0, 0.5, 0.0, 0.25])
    assert tv(freqs(tok, 5), want) < tv_bound(want, n)


def test_temperature_zero_is_greedy_with_untempered_logprob():
    # per-row: argmax of each row's logits whatever the noise or top_p; logp = log_softmax(logits)[argmax]
    lg = np.array([[0.0, 3.0, 1.0, -1.0], [2.5, 0.5, 2.0, 2.4], [-5.0, -4.0, -3.0, -3.5]], np.float32)
    temp = jnp.zeros((3,), jnp.float32)
    for seed in range(5):
        tok, logp = _sample_jit(jnp.asarray(lg), temp, jnp.asarray([1.0, 0.2, 0.9], jnp.float32),
                                jax.random.PRNGKey(seed), use_top_p=True)
        assert np.asarray(tok).tolist() == [1, 0, 2]
        ref = np_log_softmax(lg)[np.arange(3), [1, 0, 2]]
        # float32 against float64 from the same float32 logits: the log-softmax's rounding (tests/tolerances.py)
        np.testing.assert_allclose(np.asarray(logp), ref, rtol=0, atol=float(logsoftmax_err(np.zeros_like(lg)).max()))


def test_per_row_keys_make_a_row_independent_of_its_batch_position():
    """With one key per row, permuting the rows (logits, T, top_p and keys together) permutes the outputs."""
    B = 64
    rng = np.random.default_rng(0)
    lg = rng.normal(0, 2, (B, V)).astype(np.float32)
    temp = rng.choice([0.0, 0.7, 1.0, 1.5], B).astype(np.float32)
    top_p = rng.choice([0.3, 0.8, 1.0], B).astype(np.float32)
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(5), B))
    perm = rng.permutation(B)
    tok, logp = jax.device_get(_sample_jit(jnp.asarray(lg), jnp.asarray(temp), jnp.asarray(top_p),
                                           jnp.asarray(keys), use_top_p=True))
    tok_p, logp_p = jax.device_get(_sample_jit(jnp.asarray(lg[perm]), jnp.asarray(temp[perm]),
                                               jnp.asarray(top_p[perm]), jnp.asarray(keys[perm]), use_top_p=True))
    np.testing.assert_array_equal(tok_p, tok[perm])
    np.testing.assert_array_equal(logp_p, logp[perm])
    assert len(set(tok.tolist())) > 1  # not all rows drew the same token


# ---- end to end through the engine ------------------------------------------------------------------------------


def test_engine_first_token_frequencies_match_teacher_forced_softmax():
    """One-token generations from a fixed prompt: the first-token frequencies of many samples match
    softmax(logits / T) of a teacher-forced forward pass, truncated to top_p by hand. Two sampling configurations
    alternate over 32 requests of 512 samples, so every 1024-row decode batch holds both (per-row temperature and
    top-p)."""
    cfg = tiny()
    # std 0.1 (not the default 0.02, which gives a nearly uniform next-token distribution over the 17 tokens)
    params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(0), std=0.1))
    prompt = [3, 12, 4, 14, 5]
    logits = np.asarray(forward(params, jnp.asarray([prompt]), cfg))[0, -1].astype(np.float64)
    configs = [(0.7, 0.5), (2.0, 1.0)]  # (temperature, top_p)
    eng = JaxEngine(cfg, params, max_batch=1024, max_len=16, decode_chunk=1, seed=11)
    outs = eng.generate([GenerationRequest(prompt_ids=prompt, request_id=f"r{i}", params=SamplingParams(
        temperature=configs[i % 2][0], top_p=configs[i % 2][1], max_new_tokens=1, n=512)) for i in range(32)])
    assert eng.counters()["max_running_rows"] == 1024
    for j, (T, p) in enumerate(configs):
        comps = [c for i, o in enumerate(outs) if i % 2 == j for c in o]
        n = len(comps)
        assert n == 8192 and all(len(c.token_ids) == 1 for c in comps)
        tok = np.array([c.token_ids[0] for c in comps])
        lp = np.array([c.logprobs[0] for c in comps])
        full = np.exp(np_log_softmax(logits / T))
        want = np_top_p(full, p)
        # the float32 engine and this float64 reference agree on the nucleus: no token's preceding mass is near p
        before = np.array([full[full > pv].sum() for pv in full])
        assert p >= 1.0 or np.abs(before - p).min() > 0.02
        # N = 8192 over 17 tokens: tv_bound = (at most 0.5 sqrt(17 / N) = 0.023) + 0.029; the TV between the two
        # configurations' distributions and each row's wrong alternatives below is 0.27 to 0.44
        emp = freqs(tok, cfg.vocab_size)
        assert tv(emp, want) < tv_bound(want, n), f"T={T} top_p={p}: {np.round(emp, 3)} vs {np.round(want, 3)}"
        # the engine's decode and the forward pass above: two float32 orderings of the model (tests/tolerances.py)
        tol = model_logprob_tol(cfg, 16, float(np.abs(logits).max()) / T)
        np.testing.assert_allclose(lp, np_log_softmax(logits / T)[tok], atol=tol, rtol=0)
        # teeth: this row's logits under the other configuration's top-p (for top_p 0.5: the untruncated
        # distribution, i.e. the top-p mask dropped) or the other's temperature are far outside the bounds
        T_o, p_o = configs[1 - j]
        for other in (np_top_p(full, p_o), np_top_p(np.exp(np_log_softmax(logits / T_o)), p)):
            assert tv(other, want) > 2 * (tv_bound(want, n) + tv_bound(other, n))
