"""scalerl_jax/scaling/trust.py: the predictive band against a normal quantile worked by hand, A's interval at the
prior's bound, and the first eval at which a run leaves its fitted law (a collapse, a drift out of the band), with no
alarm on curves that follow the law with binomial eval noise; then a stored run that rose and collapsed, fitted by
the real command."""

import json
import math

import numpy as np
import pytest

from scalerl_jax.scaling.bayes import SigmoidPosterior
from scalerl_jax.scaling.io import RunCurve, load_run
from scalerl_jax.scaling.law import sigmoid_reward
from scalerl_jax.scaling.trust import a_bound, departure, predictive_band
from tests.conftest import ROOT

Z90 = 1.6448536269514722  # the standard normal's 95 % quantile: a central 90 % band is mean +- Z90 sd
LAW = {"A": 0.8, "B": 1.5, "C_mid": 1.0, "R0": 0.3}
DRAWS = 20000
BAND_DRAWS = 4000  # predictive_band's quantiles come from at most this many draws (its max_samples)


def _post(likelihood="counts", n=DRAWS, **over) -> SigmoidPosterior:
    """A posterior whose draws are all one point of the law (plus dispersion 1 or a sigma): its band is the eval
    noise alone, known in closed form."""
    p = {**LAW, **({"dispersion": 1.0} if likelihood == "counts" else {"sigma": 0.02}), **over}
    samples = {k: np.full(n, float(v)) for k, v in p.items() if k != "R0"}
    return SigmoidPosterior(samples=samples, R0=p["R0"], r_hat={}, ess={}, num_divergences=0, likelihood=likelihood,
                            num_chains=1, compute=np.zeros(1), reward=np.zeros(1))


def _mu(c):
    return sigmoid_reward(np.asarray(c, float), LAW["A"], LAW["B"], LAW["C_mid"], LAW["R0"])


def _curve(reward, compute, n=200, k=4) -> RunCurve:
    m = len(reward)
    return RunCurve(name="r", path="", compute_key="flops", compute=np.asarray(compute, float),
                    reward=np.asarray(reward, float), step=np.arange(m) * 4, val_n=np.full(m, float(n)),
                    val_k=np.full(m, float(k)))


def test_predictive_band_is_the_eval_noise_around_a_known_curve():
    c, nk = np.array([0.5, 1.0, 4.0]), 800.0
    lo, hi = predictive_band(_post(), c, nk=nk)
    mu = _mu(c)
    sd = np.sqrt(mu * (1 - mu) / nk)  # dispersion 1: the binomial over val_n x val_k
    # Monte Carlo error of a normal's 5 % / 95 % quantile from BAND_DRAWS draws: sqrt(0.05 x 0.95 / n) / phi(Z90) sd;
    # 5 standard errors
    se = math.sqrt(0.05 * 0.95 / BAND_DRAWS) / (math.exp(-Z90 ** 2 / 2) / math.sqrt(2 * math.pi)) * sd
    np.testing.assert_array_less(np.abs(lo - (mu - Z90 * sd)), 5 * se)
    np.testing.assert_array_less(np.abs(hi - (mu + Z90 * sd)), 5 * se)
    lo_n, hi_n = predictive_band(_post("normal"), c)  # the normal likelihood: sigma 0.02 whatever the counts
    se_n = math.sqrt(0.05 * 0.95 / BAND_DRAWS) / (math.exp(-Z90 ** 2 / 2) / math.sqrt(2 * math.pi)) * 0.02
    np.testing.assert_array_less(np.abs(lo_n - (mu - Z90 * 0.02)), 5 * se_n)
    np.testing.assert_array_less(np.abs(hi_n - (mu + Z90 * 0.02)), 5 * se_n)
    with pytest.raises(ValueError, match="val_n x val_k"):
        predictive_band(_post(), c)


def test_a_at_the_prior_bound_is_named_and_an_inner_ceiling_is_not():
    rng = np.random.default_rng(0)
    rising = _post()
    rising.samples["A"] = rng.uniform(0.9, 1.0, DRAWS)  # the data only say A > 0.9: the prior's bound caps it
    a = a_bound(rising)
    assert a["at_bound"] and a["bound"] == 1.0 and a["lo"] == pytest.approx(0.905, abs=0.002)
    inner = _post()
    inner.samples["A"] = rng.normal(0.8, 0.02, DRAWS)  # pinned well inside: hi ~0.833 < 1 - 0.02 x 0.7
    assert not a_bound(inner)["at_bound"]


def test_a_collapse_after_the_fit_window_is_found_at_its_first_eval():
    c = np.linspace(0.1, 4.0, 30)
    r = _mu(c)
    fit = c <= 2.0
    r[c > 3.0] = 0.30  # the run falls back to where it started, well below its best (~0.73)
    d = departure(_curve(r, c), fit, _post())
    i = int(np.flatnonzero(c > 3.0)[0])
    assert d["step"] == 4 * i and d["compute"] == pytest.approx(c[i])
    assert d["reason"].startswith("a fall from the best eval so far") or "in a row" in d["reason"]
    assert d["outside"] == int((c > 3.0).sum())


def test_a_drift_out_of_the_band_needs_three_evals_in_a_row():
    c = np.linspace(0.1, 4.0, 30)
    r = _mu(c)
    fit = c <= 2.0
    held = np.flatnonzero(~fit)
    mu, nk = _mu(c), 800.0
    up = mu + 3 * np.sqrt(mu * (1 - mu) / nk)  # 3 sd above the law: outside the 90 % band, no fall
    r[held[[2, 3]]] = up[held[[2, 3]]]  # two in a row: not yet
    r[held[[6, 7, 8]]] = up[held[[6, 7, 8]]]  # three in a row: here
    d = departure(_curve(r, c), fit, _post())
    assert d["step"] == 4 * held[6] and "3 evals in a row" in d["reason"] and d["outside"] == 5


def test_curves_that_follow_the_law_with_eval_noise_raise_no_alarm():
    """20 runs on the law, each eval the mean of 4 samples of 200 prompts (prompt pass rates spread by a Beta of
    concentration 20, so the samples of one prompt agree more than a binomial's: the eval's variance is mu (1 - mu)
    / 700 where the binomial over 800 draws says / 800, which the fit's dispersion absorbs, here set to 800 / 700).
    The band misses 10 % of evals by design; 3 in a row (0.1 % per position, about 1 % per run of 14 held-out evals)
    or a 4-sd fall should not happen in more than one of the 20 (fixed seeds: the outcome is the same on every
    machine)."""
    c = np.linspace(0.1, 4.0, 30)
    fit = c <= 2.0
    alarms, outside = [], 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        mu = _mu(c)
        p = rng.beta(mu[:, None] * 20, (1 - mu[:, None]) * 20, size=(30, 200))  # each prompt's pass rate
        r = rng.binomial(4, p).mean(axis=1) / 4
        d = departure(_curve(r, c), fit, _post(dispersion=800 / 700))
        alarms.append(d["step"])
        outside += d["outside"]
    assert sum(a is not None for a in alarms) <= 1, alarms
    # the band is calibrated: 10 % of the 20 x 14 held-out evals outside it, within 3 binomial standard errors
    n_held = 20 * int((~fit).sum())
    assert abs(outside / n_held - 0.10) <= 3 * math.sqrt(0.1 * 0.9 / n_held), outside / n_held


def test_no_later_evals_no_verdict():
    c = np.linspace(0.1, 2.0, 10)
    d = departure(_curve(_mu(c), c), np.ones(10, bool), _post())
    assert d["step"] is None and d["n_held"] == 0


@pytest.mark.slow
@pytest.mark.extended  # half a minute of NUTS on a stored study's run: one of CI's extended checks
def test_the_report_of_a_stored_run_that_collapsed_says_it_left_its_law(tmp_path):
    """results/loo_chain384's ScaleRL seed 2 rose to 0.426 by step 104 and fell to 0.13-0.34 from step 140 on: its
    first-half fit (NUTS, the command's counts likelihood) must not be reported as a sigmoid still to be trusted."""
    from scalerl_jax.scaling.report import fit_runs

    run = ROOT / "results" / "loo_chain384" / "scalerl_s2"
    curve = load_run(run, compute_key="flops")
    summary = fit_runs([run], tmp_path, fit_until=0.5, compute_key="flops", num_samples=300, num_chains=2,
                       make_plots=False)
    entry = next(iter(summary["runs"].values()))
    d = entry["trust"]["departure"]
    assert d["step"] is not None and 140 <= d["step"] <= 250, d
    # the named eval is below the run's best so far by more than the noise of two evals allows (n = 200 prompts)
    i = int(np.flatnonzero(curve.step == d["step"])[0])
    best, p = curve.reward[: i + 1].max(), curve.reward[i]
    if d["reason"].startswith("a fall"):
        assert best - p > 4 * math.sqrt(best * (1 - best) / 200 + p * (1 - p) / 200), (best, p)
    else:
        assert "3 evals in a row" in d["reason"]
    report = (tmp_path / "report.md").read_text()
    assert f"left its fitted law at step {d['step']}" in report and "not to be trusted" in report
    name = next(iter(summary["runs"]))
    assert json.loads((tmp_path / "summary.json").read_text())["runs"][name]["trust"]["departure"] == d
