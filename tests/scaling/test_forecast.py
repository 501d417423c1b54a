"""The live forecast: refits of a growing metrics.jsonl (warm-started), against a baseline, the stop rule, the
refit process's protocol, and the history the report draws."""

import dataclasses
import json
import sys
import time
import warnings

import numpy as np
import pytest

from scalerl_jax.config import ConfigError, ForecastConfig
from scalerl_jax.scaling import ScalingFitWarning, fit_bayes
from scalerl_jax.scaling.bayes import _prepare, _start_adaptation
from scalerl_jax.scaling.compare import A_MARGIN
from scalerl_jax.scaling.forecast import Forecaster, StopRule, forecast_history, stop_reason, target_compute
from scalerl_jax.scaling.live import LiveForecast
from scalerl_jax.scaling.paper import TABLE1
from tests.conftest import HANG_S, printed_json
from tests.tolerances import ops

N_PROMPTS, K_SAMPLES, PHI, R0_TRUE = 200, 8, 2.0, 0.30
NUTS = {"num_samples": 300, "num_chains": 2, "num_warmup": 200}
WARM_WARMUP = ForecastConfig().warm_warmup  # a refit from the previous refit's adaptation: the live forecast's
DRAWS = NUTS["num_samples"] * NUTS["num_chains"]  # posterior draws per refit
MC_SIGMAS = 6  # Monte Carlo tolerances: standard errors (a normal's two tails beyond 6: 2e-9)


def _law(c, A, B, C_mid, R0):
    # written out independently of the package: R0 + (A - R0) / (1 + (C_mid / C)^B), R0 at C = 0
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(c > 0, R0 + (A - R0) / (1.0 + (C_mid / np.where(c > 0, c, 1.0)) ** B), R0)


def _evals(A, B, C_mid, seed, n=24, span=4.0):
    """n eval rows from compute 0 to ``span`` x C_mid; each the pass rate of N_PROMPTS prompts x K_SAMPLES samples
    whose per-prompt rates are Beta-distributed around the curve."""
    rng = np.random.default_rng(seed)
    c = np.linspace(0.0, span * C_mid, n)
    mu = _law(c, A, B, C_mid, R0_TRUE)
    p = rng.beta(mu[:, None] * PHI, (1 - mu[:, None]) * PHI, size=(n, N_PROMPTS))
    r = rng.binomial(K_SAMPLES, p).mean(axis=1) / K_SAMPLES
    return [{"kind": "eval", "step": 10 * i, "device_hours": float(c[i]), "flops": float(c[i]) * 1e15,
             "val_reward": float(r[i]), "val_n": N_PROMPTS, "val_k": K_SAMPLES} for i in range(n)]


def _write(path, rows, mode="w"):
    with open(path, mode) as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_target_compute_extrapolates_linearly():
    # 2 x 200 / 50: exact in float64 (small integers and powers of two)
    assert target_compute(2.0, 50, 200) == 8.0  # 2 device-hours per 50 steps -> 200 steps
    assert target_compute(2.0, 300, 200) == 2.0  # past the plan: where it is
    assert np.isnan(target_compute(0.0, 0, 200))
    # at the last step the target is the compute itself, to the bit (x * 48 / 48 is not always x)
    assert 0.02127593824806253 * 48 / 48 != 0.02127593824806253
    assert target_compute(0.02127593824806253, 48, 48) == 0.02127593824806253
    assert target_compute(0.02127593824806253, 50, 48) == 0.02127593824806253


def narrowing_refits(out_dir: str) -> list[dict]:
    """Run by tests/scaling/_forecast_refits.py in the suite's background lane: one Forecaster per Table 1 row
    refits its run as the evals arrive (6, 12, 18, 24 of them: up to 1, 2, 3 and 4 C_mid); per row, its true A, its
    eval rows and the forecast row of each stage."""
    from pathlib import Path

    res = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingFitWarning)
        for i, (_, c_mid, b, a) in enumerate(TABLE1):
            rows = _evals(a, b, c_mid, seed=100 + i)
            run = Path(out_dir) / f"run{i}"
            run.mkdir(parents=True)
            fc = Forecaster(run, min_evals=5, warm_warmup=WARM_WARMUP, **NUTS)  # as the live forecast refits
            stages = []
            for n in (6, 12, 18, 24):
                _write(run / "metrics.jsonl", rows[:n])
                stages.append(fc.refit(total_steps=230))
            res.append({"A": a, "rows": rows, "stages": stages})
    return res


@pytest.mark.background("forecast_refits", ["tests/scaling/_forecast_refits.py", "{out}"])
def test_forecasts_narrow_with_compute_and_cover_the_true_ceiling(background):
    """The refits above: the last interval is narrower than the first, and the 90 % intervals hold the true A about
    as often as they say."""
    widths, hits, final_held = [], [], []
    for run in printed_json(background["forecast_refits"]):
        a, rows, w, prev, full_on = run["A"], run["rows"], [], None, 0
        for n, row in zip((6, 12, 18, 24), run["stages"]):
            assert row["n_evals"] == n and row["step"] == 10 * (n - 1) and row["warm_start"] == (n > 6)
            # a refit starts from the previous one's adaptation when that one was healthy (no divergence, R-hat <=
            # 1.05) and the evals have not grown past twice those of the last refit adapted from scratch (6, 12, 18,
            # 24: the first adapts from scratch; 18 does when 6 was the last full one)
            assert Forecaster.WARM_GROWTH == 2.0
            healthy = prev is not None and prev["divergences"] == 0 and prev["r_hat_max"] <= Forecaster.WARM_RHAT_MAX
            assert row["warm_adaptation"] == (healthy and n <= 2 * full_on)
            full_on = full_on if row["warm_adaptation"] else n
            prev = row
            w.append(row["A_hi"] - row["A_lo"])
            hits.append(row["A_lo"] <= a <= row["A_hi"])
            # the measured value's interval holds the mean curve's and widens it by the eval's own noise, up to the
            # Monte Carlo error of a 5 % / 95 % quantile of the posterior's draws: for a normal of sd = width / 3.29,
            # sqrt(0.05 x 0.95 / n) / phi(1.645) sd = 0.64 width / sqrt(n), MC_SIGMAS of them
            mc = MC_SIGMAS * 0.64 * (row["R_target_hi"] - row["R_target_lo"]) / np.sqrt(DRAWS)
            assert row["R_obs_lo"] <= row["R_target_lo"] + mc and row["R_target_hi"] <= row["R_obs_hi"] + mc
            assert row["R_obs_hi"] - row["R_obs_lo"] >= row["R_target_hi"] - row["R_target_lo"] - 2 * mc
            if n == 18:  # 3/4 of the run: the target is the last eval's compute (steps and compute are linear)
                # a float64 product and division of the rows' compute (x total / n) against the last row's
                assert row["target_compute"] == pytest.approx(rows[-1]["device_hours"], rel=2 * ops(2, "float64"))
                final_held.append(row["R_obs_lo"] <= rows[-1]["val_reward"] <= row["R_obs_hi"])
        widths.append(w)
    widths = np.array(widths)
    assert len(widths) == len(TABLE1)
    print("median A interval width by stage:", np.round(np.median(widths, axis=0), 3), "coverage", np.mean(hits))
    assert np.median(widths[:, -1]) < 0.5 * np.median(widths[:, 0])
    assert np.all(widths[:, -1] < widths[:, 0] + 1e-9)
    assert 0.75 <= np.mean(hits) <= 1.0  # 40 intervals at 90 %: binomial 5th percentile is 0.825
    assert sum(final_held) >= 7, final_held  # 10 at 90 %: 7 or more with probability 0.99


@pytest.fixture(scope="module")
def table1_fit():
    """One Table 1 row's 24 evals and a cold full fit of them (4 chains x 1,000 draws after 500 warm-up steps), shared
    by the tests below that compare other ways of sampling the same posterior with it."""
    rows = _evals(0.61, 1.92, 2542.0, seed=7)
    c = np.array([r["device_hours"] for r in rows])
    r = np.array([r["val_reward"] for r in rows])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingFitWarning)
        cold = fit_bayes(c, r, None, n_prompts=N_PROMPTS, k_samples=K_SAMPLES, seed=1, **FULL)
    return c, r, cold


FULL = {"num_samples": 1000, "num_chains": 4}  # fit_bayes' default warm-up: min(num_samples, 500) steps


def test_warm_start_gives_the_cold_posterior(table1_fit):
    """Starting the chains at an earlier fit's medians changes where they start, not what they sample."""
    c, r, cold = table1_fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingFitWarning)
        warm = fit_bayes(c, r, None, n_prompts=N_PROMPTS, k_samples=K_SAMPLES, seed=2, **FULL,
                         init={"A": 0.6, "B": 2.0, "C_mid": 2500.0, "R0": 0.3, "dispersion": 2.0})
    _same_posterior(cold, warm)


def _same_posterior(ref, other, keys=("A", "B")):
    """Two samplers of one posterior differ by their Monte Carlo errors (tests/tolerances.py's statistical note): a
    mean's is sd / sqrt(ESS), a 5 % / 95 % quantile's 0.64 width / sqrt(ESS) (sd = width / 3.29); MC_SIGMAS of the
    two combined."""
    for k in keys:
        sr, so = ref.summary()[k], other.summary()[k]
        ess = min(ref.ess[k], other.ess[k])
        width = sr["hi"] - sr["lo"]
        assert so["mean"] == pytest.approx(sr["mean"], abs=MC_SIGMAS * np.sqrt(2) * width / 3.29 / np.sqrt(ess))
        assert (so["hi"] - so["lo"]) == pytest.approx(width, rel=MC_SIGMAS * 2 * 0.64 / np.sqrt(ess))


def test_a_refit_from_the_previous_fits_adaptation_gives_the_full_posterior(table1_fit):
    """The live forecast's cheap refit: the curve grew by one eval, and the chains start from the previous fit's
    medians, step sizes and mass matrices with a 15-step warm-up (which retunes the step size and keeps the mass
    matrix). Its posterior is the one a full fit (500 adaptation steps from the identity) samples."""
    c, r, full = table1_fit
    fit = dict(n_prompts=N_PROMPTS, k_samples=K_SAMPLES, **FULL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingFitWarning)
        prev = fit_bayes(c[:-1], r[:-1], None, seed=3, **fit)
        init = {k: v["median"] for k, v in prev.summary().items()}
        warm = fit_bayes(c, r, None, seed=4, init=init, adaptation=prev.adaptation,
                         **{**fit, "num_warmup": WARM_WARMUP})
    assert WARM_WARMUP < 20  # numpyro's warm-up of fewer than 20 steps is one window: step size only
    np.testing.assert_allclose(warm.adaptation["inverse_mass_matrix"], prev.adaptation["inverse_mass_matrix"],
                               rtol=1e-6)  # kept (float32 round trip)
    assert max(warm.r_hat.values()) <= 1.05  # the chains agree (a healthy fit; 1.01 is the warning's threshold)
    _same_posterior(full, warm)
    # an adaptation is used only by the model variant and chain count it was made for: R0 fixed samples one site
    # fewer, and 2 chains are not 4
    for R0, chains in ((0.3, 4), (None, 2)):
        prep = _prepare(c, r, R0, N_PROMPTS, K_SAMPLES, None, 0.0)
        step, inv = _start_adaptation(prep, prev.adaptation, chains)
        assert np.all(step == 1.0) and np.all(inv == 1.0) and inv.shape[0] == chains
    step, inv = _start_adaptation(_prepare(c, r, None, N_PROMPTS, K_SAMPLES, None, 0.0), prev.adaptation, 4)
    np.testing.assert_array_equal(inv, prev.adaptation["inverse_mass_matrix"])


def baseline_refits(out_dir: str) -> dict:
    """Run by tests/scaling/_forecast_refits.py (``baseline``) in the suite's background lane: this run's forecast
    row against a baseline of a higher ceiling, a lower one and the same evals."""
    from pathlib import Path

    ours = Path(out_dir) / "ours"
    ours.mkdir(parents=True)
    _write(ours / "metrics.jsonl", _evals(0.60, 1.9, 2500.0, seed=1, n=18))  # up to 3 C_mid
    rows = {}
    for name, a in (("high", 0.85), ("low", 0.45), ("same", None)):
        base = Path(out_dir) / name
        base.mkdir()  # "same": a copy of this run's own evals
        _write(base / "metrics.jsonl", _evals(a, 1.9, 2500.0, seed=2, n=24) if a else _evals(0.60, 1.9, 2500.0, 1, 18))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ScalingFitWarning)
            rows[name] = Forecaster(ours, baseline=base, **NUTS).refit(total_steps=230)
    # one posterior against itself: the two mean A's are equal whatever the sampler drew, so B is compared at A
    # (the "same" run's two fits differ by their Monte Carlo error, which may or may not stay within the margin)
    f = Forecaster(ours, baseline=Path(out_dir) / "same", **NUTS)
    rows["identical"] = f._against(f.baseline(), f.baseline())
    return rows


@pytest.mark.background("forecast_baselines", ["tests/scaling/_forecast_refits.py", "{out}", "baseline"])
def test_baseline_comparison_and_stop_rule(background):
    """A baseline with a clearly higher ceiling makes P(A > A_baseline) small and stops the run under
    --stop-if-worse 0.9; a lower one does not; within the paper's margin B is compared at a shared A."""
    rows = printed_json(background["forecast_baselines"])
    stops = {name: (row, stop_reason(row, 0.9, 6)) for name, row in rows.items() if name != "identical"}
    high, why = stops["high"]
    print({k: round(v[0]["P_A_gt_baseline"], 3) for k, v in stops.items()}, high["A_lo"], high["A_hi"])
    assert high["P_A_gt_baseline"] < 0.1 and high["baseline_rule"] == "A"
    assert why is not None and "P(A < A_baseline)" in why and "step 170" in why
    low, why = stops["low"]
    assert low["P_A_gt_baseline"] > 0.5 and why is None  # a low, flat baseline's own ceiling is loosely pinned
    assert high["P_A_gt_baseline"] < stops["same"][0]["P_A_gt_baseline"] < low["P_A_gt_baseline"]
    same, why = stops["same"]
    # the same evals fitted twice: neither ceiling ahead; the rule follows the two means (their difference is the two
    # samplers' Monte Carlo error, which differs between CPUs), and within the margin B is compared at a shared A
    assert 0.2 <= same["P_A_gt_baseline"] <= 0.8
    d_a = same["A_mean"] - same["baseline_A_mean"]
    assert same["baseline_rule"] == ("A" if abs(d_a) > A_MARGIN else "B at shared A")
    if same["baseline_rule"] != "A":
        assert 0.2 <= same["P_B_gt_baseline"] <= 0.8
        # the shared A is the midpoint of two posterior means within the paper's margin: at most half the margin
        # from either (plus the float64 midpoint's roundings, on values below 1)
        assert same["baseline_A_shared"] == pytest.approx(same["A_mean"], abs=A_MARGIN / 2 + ops(3, "float64"))
    identical = rows["identical"]
    assert identical["baseline_rule"] == "B at shared A" and 0.2 <= identical["P_B_gt_baseline"] <= 0.8
    assert identical["baseline_A_shared"] == pytest.approx(identical["baseline_A_mean"], abs=ops(3, "float64"))
    assert why is None
    # too few evals for the rule: no stop whatever the probability
    assert stop_reason({**high, "n_evals": 5}, 0.9, 6) is None
    assert stop_reason(high, None, 6) is None


def test_stop_rule_needs_consecutive_forecasts():
    worse = {"step": 10, "n_evals": 8, "P_A_gt_baseline": 0.02, "A_mean": 0.5, "A_lo": 0.4, "A_hi": 0.6,
             "baseline_A_mean": 0.9}
    better = {**worse, "P_A_gt_baseline": 0.4}
    rule = StopRule(0.9, 6, confirmations=2)
    why, note = rule.update(worse)
    assert why is None and "1 of 2" in note
    assert rule.update(better) == (None, None)  # a dissent resets the count
    assert rule.update(worse)[0] is None
    why, note = rule.update({**worse, "step": 14})
    assert note is None and "step 14" in why and "2 consecutive forecasts agreed" in why
    one = StopRule(0.9, 6, confirmations=1)
    assert one.update(worse)[0] == stop_reason(worse, 0.9, 6)


def test_warm_start_centres_the_chains_on_the_given_values():
    """The unconstrained start point, worked by hand from the model's transforms: z_B = (log B - log 1.5) / 1,
    z_C = (log C_mid - logc_loc) / logc_scale, u_A = logit((A - R0) / (1 - R0)), R0 -> logit, d -> log(log d)."""
    from scalerl_jax.scaling.bayes import COLD_SPREAD, WARM_SPREAD, _prepare, _start_point

    c = np.array([0.0, 1.0, 2.0, 4.0, 8.0, 16.0])
    prep = _prepare(c, np.linspace(0.3, 0.6, 6), None, 100, 4, None, 0.0)
    loc, scale = 0.5 * (np.log(1.0) + np.log(16.0)), max(2.0, np.log(16.0))
    centre, spread = _start_point(prep, {"A": 0.7, "B": 2.0, "C_mid": 4.0, "R0": 0.3, "dispersion": 3.0})
    assert spread == WARM_SPREAD
    # float64 on both sides, a few roundings each (a log counts 4, tests/tolerances.py); z_B's difference of logs
    # cancels (0.69 - 0.41: a factor 4) and takes the wider bound
    start64 = 2 * ops(4, "float64", transcendental=2)
    assert centre["z_B"] == pytest.approx(np.log(2.0) - np.log(1.5), rel=4 * start64)
    assert centre["z_C"] == pytest.approx((np.log(4.0) - loc) / scale, rel=start64)
    assert centre["R0"] == pytest.approx(np.log(0.3 / 0.7), rel=start64)
    assert centre["u_A"] == pytest.approx(np.log((0.4 / 0.7) / (1 - 0.4 / 0.7)), rel=start64)
    assert centre["log_disp"] == pytest.approx(np.log(np.log(3.0)), rel=start64)
    assert _start_point(prep, None) == ({k: 0.0 for k in centre}, COLD_SPREAD)


def test_forecast_config_refuses_a_stop_without_baseline():
    with pytest.raises(ConfigError, match="--baseline"):
        ForecastConfig(stop_if_worse=0.9)
    with pytest.raises(ConfigError, match="probability"):
        ForecastConfig(stop_if_worse=1.5, baseline="x")


def test_history_finds_where_the_intervals_start_holding_the_final_value():
    rows = [{"kind": "forecast", "compute": c, "A_mean": 0.6, "A_lo": 0.5, "A_hi": 0.7, "R_target_mean": m,
             "R_target_lo": m - 0.05, "R_target_hi": m + 0.05, "target_compute": 10.0}
            for c, m in ((1.0, 0.40), (2.0, 0.56), (3.0, 0.45), (4.0, 0.53), (5.0, 0.50))]
    h = forecast_history(rows, final_compute=10.0, final_reward=0.52)
    # 0.52 is in [0.51, 0.61], not in [0.40, 0.50], then in [0.48, 0.58] and [0.45, 0.55]: held from compute 4 on
    assert h["held_from_compute"] == 4.0 and h["held_from_fraction"] == pytest.approx(0.4, rel=ops(1, "float64"))
    assert forecast_history(rows, 10.0, 0.9)["held_from_compute"] is None
    assert forecast_history([], 1.0, 0.5) is None


def test_live_forecast_process_answers_as_evals_arrive(tmp_path):
    """The refit process runs outside the trainer's process, answers null below min_evals, a row from then on, and
    exits when the trainer closes it."""
    rows = _evals(0.61, 1.92, 2542.0, seed=3, n=8)
    _write(tmp_path / "metrics.jsonl", rows[:3])
    lines = []
    # niceness 0 here: on a machine busy with the rest of the suite, a niced process waits its turn for minutes
    lf = LiveForecast(tmp_path, ForecastConfig(num_samples=100, num_chains=2, num_warmup=100, max_share=1.0, nice=0),
                      total_steps=70, log=lines.append)
    try:
        lf.after_eval()
        assert lf.poll(wait_s=1) == [] and not lf.busy  # 3 evals: nothing to fit, nothing asked
        for r in rows[3:6]:  # one call per eval written, as the trainer makes them
            _write(tmp_path / "metrics.jsonl", [r], mode="a")
            lf.after_eval()
        got = lf.poll(wait_s=300)
        # the 5th eval asks; the 6th arrives during that refit and is asked for when it returns (or both at once)
        assert 1 <= len(got) <= 2 and got[-1]["n_evals"] == 6 and got[0]["worker_pid"] != __import__("os").getpid()
        assert 0.0 <= got[0]["A_lo"] <= got[0]["A_mean"] <= got[0]["A_hi"] <= 1.0
        for r in rows[6:]:
            _write(tmp_path / "metrics.jsonl", [r], mode="a")
            lf.after_eval(force=True)
        got = lf.finish()
        assert got and got[-1]["n_evals"] == 8 and all(r["warm_start"] for r in got)
    finally:
        lf.close()
    assert lf.proc.returncode == 0 and not lines
    assert "ready for" in (tmp_path / "forecast.log").read_text()


def test_live_forecast_survives_a_dead_process(tmp_path):
    _write(tmp_path / "metrics.jsonl", _evals(0.61, 1.92, 2542.0, seed=3, n=6))
    lines = []
    lf = LiveForecast(tmp_path, ForecastConfig(), total_steps=70, log=lines.append)
    lf.proc.kill()
    lf.proc.wait()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120 and lf.dead is None:  # seen at once; a hang guard for a loaded machine
        lf.after_eval()
        lf.poll(wait_s=1)
    lf.close()
    assert lf.dead is not None and len(lines) == 1 and "goes on without the live forecast" in lines[0]


def test_the_time_budget_skips_refits_except_under_a_stop_rule(tmp_path):
    """With the refits' share of the run's wall time spent (a hand-set 10 s of refit CPU in a 1 s old run, against
    max_share 0.1), an eval's refit is skipped and left pending; under --stop-if-worse it is asked for all the same
    (the stop rule acts only on forecasts). Nothing here waits for the refit process: it is killed unanswered."""
    _write(tmp_path / "metrics.jsonl", _evals(0.61, 1.92, 2542.0, seed=3, n=6))
    asked = {}
    for name, cfg in (("budget", ForecastConfig(max_share=0.1)),
                      ("stop rule", ForecastConfig(max_share=0.1, baseline=str(tmp_path), stop_if_worse=0.9))):
        lf = LiveForecast(tmp_path, cfg, total_steps=70, log=lambda s: None)
        try:
            lf._started, lf.fit_cpu_seconds, lf.t0 = True, 10.0, time.monotonic() - 1.0
            assert lf.share() > cfg.max_share
            lf.after_eval()  # 6 evals on file >= min_evals 5
            asked[name] = (lf.busy, lf.pending, lf.skipped)
        finally:
            lf.proc.kill()
            lf.proc.wait()
            lf.close()
    assert asked == {"budget": (False, True, 1), "stop rule": (True, False, 0)}


def test_a_refit_slowed_by_a_busy_machine_spends_only_its_cpu_time(tmp_path):
    """A refit that waited 10 s for a core (its wall time) but ran 0.05 s of CPU, in a 10 s old run: the budget
    (max_share 0.1) counts 0.05 s of 10 s, so the next eval's refit is asked for at once; the wall time is still
    reported (fit_seconds). With the same refit at 10 s of CPU the next one waits. The replies are handed to the
    trainer's side as the reader thread would; the refit process itself is killed unanswered."""
    _write(tmp_path / "metrics.jsonl", _evals(0.61, 1.92, 2542.0, seed=3, n=6))
    asked = {}
    for cpu in (0.05, 10.0):
        lf = LiveForecast(tmp_path, ForecastConfig(max_share=0.1), total_steps=70, log=lambda s: None)
        try:
            now = time.monotonic()
            lf._started, lf.t0, lf.busy_since = True, now - 10.0, now - 10.0  # a refit in flight for 10 s
            lf._replies.put({"row": None, "seconds": 10.0, "cpu_seconds": cpu})
            lf.poll()
            assert not lf.busy and lf.fit_seconds >= 10.0 and lf.fit_cpu_seconds == cpu
            lf.after_eval()  # 6 evals on file >= min_evals 5
            asked[cpu] = (lf.busy, lf.skipped)
        finally:
            lf.proc.kill()
            lf.proc.wait()
            lf.close()
    assert asked == {0.05: (True, 0), 10.0: (False, 1)}


def test_refit_process_help():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "scalerl_jax.scaling.live", "--help"], capture_output=True,
                         text=True, timeout=HANG_S)
    assert out.returncode == 0 and "refit process" in out.stdout


def test_planned_evals_and_a_run_too_short_for_a_refit():
    from scalerl_jax.config import ExperimentConfig, ForecastConfig, TrainConfig, forecast_runs, planned_evals

    # worked by hand: evals at step 0, every multiple of eval_every, and the last step
    assert planned_evals(TrainConfig(steps=2, eval_every=100)) == 2  # 0, 2
    assert planned_evals(TrainConfig(steps=48, eval_every=2)) == 25  # 0, 2, ..., 48
    assert planned_evals(TrainConfig(steps=10, eval_every=4)) == 4  # 0, 4, 8, 10
    assert planned_evals(TrainConfig(steps=8, eval_every=4)) == 3  # 0, 4, 8
    exp = ExperimentConfig(train=TrainConfig(steps=10, eval_every=4))
    assert not forecast_runs(exp)  # 4 evals < min_evals 5: no refit process is started
    assert forecast_runs(dataclasses.replace(exp, forecast=ForecastConfig(min_evals=4)))
    assert not forecast_runs(dataclasses.replace(exp, train=TrainConfig(steps=100, eval_every=4),
                                                 forecast=ForecastConfig(enabled=False)))
