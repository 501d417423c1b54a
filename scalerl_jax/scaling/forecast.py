"""The forecast while a run trains: refit the law on every eval so far, compare with a baseline run, decide to stop.

A :class:`Forecaster` reads a run's metrics.jsonl each time it is asked (so a resumed run, or a run written by
another process, is read as it stands), fits the NumPyro posterior on all its evals, warm-started from its previous
fit, and returns one ``"kind": "forecast"`` row: the ceiling A, efficiency B and midpoint C_mid (mean and 90 %
interval), the predicted reward at the run's target compute, the fit's diagnostics and, with a baseline run, the
probabilities that this run's A and B exceed the baseline's. :func:`stop_reason` applies ``--stop-if-worse``;
:func:`forecast_history` reads the rows back for the report. The background process that runs the Forecaster
beside training is :mod:`scalerl_jax.scaling.live`.
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import numpy as np

from .bayes import SigmoidPosterior, fit_bayes, fit_bayes_batch
from .compare import A_MARGIN, prob_greater
from .io import load_run
from .report import _bayes_inputs
from .trust import predictive_band

__all__ = ["Forecaster", "StopRule", "forecast_history", "stop_reason", "target_compute"]

INTERVAL = 0.9


def target_compute(compute: float, step: int, total_steps: int) -> float:
    """The run's compute at its last step, extrapolated linearly from ``compute`` spent by ``step``."""
    if step <= 0 or not compute > 0:
        return float("nan")
    if int(total_steps) <= int(step):  # at (or past) the last step: the compute itself (x * n / n can round off)
        return float(compute)
    return float(compute) * int(total_steps) / int(step)


def observed_interval(post: SigmoidPosterior, compute: float, n_prompts: float | None, k_samples: float | None,
                      seed: int = 0) -> tuple[float, float]:
    """The 90 % posterior predictive interval of one eval's measured reward at ``compute``
    (:func:`scalerl_jax.scaling.trust.predictive_band`: the mean curve's uncertainty plus the eval's own noise as the
    fit's likelihood models it). A single eval is what a run ends with, so this is the interval to hold its final
    value against."""
    nk = float(n_prompts) * float(k_samples) if n_prompts and k_samples else None
    if post.likelihood == "counts" and nk is None:
        mu = post.predict([compute], interval=INTERVAL)
        return float(mu[1][0]), float(mu[2][0])  # no eval size to add its noise: the mean curve's interval
    lo, hi = predictive_band(post, [compute], nk=nk, interval=INTERVAL, seed=seed, max_samples=None)
    return float(lo[0]), float(hi[0])


class Forecaster:
    """Refits one run's curve on demand; optionally compares each fit with a baseline run's posterior.

    Args:
        run_dir: the run directory whose metrics.jsonl grows (or the file itself).
        compute_key: the eval rows' compute column ("device_hours" or "flops").
        min_evals: refuse to fit (``refit`` returns None) on fewer evals.
        baseline: a run directory of the same task (finished or still running); refitted on all its evals
            whenever its metrics.jsonl has grown.
        num_samples, num_chains, num_warmup, seed: NUTS settings of a full fit (the first refit, the baseline's).
        warm_warmup: warm-up steps of a refit that starts from the previous refit's adapted step sizes and mass
            matrices (below 20: the step size is retuned, the mass matrix kept; see ``fit_bayes(adaptation=)``),
            used when that refit was healthy (no divergence, R-hat <= ``WARM_RHAT_MAX``) and the curve has not
            grown past ``WARM_GROWTH`` times the evals of the last fully adapted refit (the posterior narrows as
            evals arrive, and a kept mass matrix would fit it less and less); None or 0: every refit runs the full
            ``num_warmup``.
    """

    WARM_RHAT_MAX = 1.05  # the previous refit's worst R-hat up to which its adaptation is reused
    WARM_GROWTH = 2.0  # a full adaptation again once the evals have doubled since the last one

    def __init__(self, run_dir, *, compute_key: str = "device_hours", min_evals: int = 5, baseline=None,
                 num_samples: int = 500, num_chains: int = 4, num_warmup: int = 300, seed: int = 0,
                 warm_warmup: int | None = None) -> None:
        self.run_dir, self.compute_key, self.min_evals = Path(run_dir), compute_key, int(min_evals)
        self.nuts = {"num_samples": int(num_samples), "num_chains": int(num_chains), "num_warmup": int(num_warmup)}
        self.warm_warmup = int(warm_warmup or 0)
        self._adapt: dict | None = None  # the previous healthy refit's adaptation, for the next refit
        self._adapted_on = 0  # evals of the last refit adapted from scratch
        self.seed = int(seed)
        self.baseline_dir = None if baseline is None else Path(baseline)
        self._baseline: tuple[int, SigmoidPosterior] | None = None  # (evals it was fitted on, posterior)
        self._init: dict | None = None  # the previous fit's medians: the next fit's warm start
        self.n_fits = 0

    def _fit(self, curve, init: dict | None, seed: int, adaptation: dict | None = None
             ) -> tuple[SigmoidPosterior, list[str]]:
        d = _bayes_inputs(curve, np.ones(curve.compute.size, bool), 0.0)
        nuts = dict(self.nuts)
        if adaptation is not None:
            nuts["num_warmup"] = self.warm_warmup
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            post = fit_bayes(d["compute"], d["reward"], d.get("R0"), n_prompts=d.get("n_prompts"),
                             k_samples=d.get("k_samples"), init=init, seed=seed, adaptation=adaptation, **nuts)
        return post, [str(w.message) for w in rec]

    def warm_up(self) -> None:
        """Compile the sampler on a synthetic curve of the shape a run's evals have (a step-0 eval: R0 fitted; eval
        counts: the binomial-like likelihood), so that the first real refit finds it compiled."""
        c = np.linspace(0.0, 1.0, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = fit_bayes(c, 0.3 + 0.3 * c / (0.5 + c), None, n_prompts=100, k_samples=4, seed=self.seed,
                             **self.nuts)
            if self.warm_warmup:  # the warm refit's sampler too (another warm-up length: another compilation)
                fit_bayes(c, 0.3 + 0.3 * c / (0.5 + c), None, n_prompts=100, k_samples=4, seed=self.seed,
                          adaptation=post.adaptation, **{**self.nuts, "num_warmup": self.warm_warmup})

    def baseline(self) -> SigmoidPosterior | None:
        """The baseline's posterior on all its evals, refitted when it has more evals than at the last call."""
        if self.baseline_dir is None:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            curve = load_run(self.baseline_dir, compute_key=self.compute_key)
        if self._baseline is None or curve.compute.size > self._baseline[0]:
            if curve.compute.size < self.min_evals:
                raise ValueError(f"baseline {self.baseline_dir}: {curve.compute.size} eval rows with "
                                 f"{self.compute_key!r}; need at least {self.min_evals} to fit its ceiling")
            post, _ = self._fit(curve, None, self.seed + 1)
            self._baseline = (int(curve.compute.size), post)
        return self._baseline[1]

    def refit(self, total_steps: int | None = None) -> dict | None:
        """One forecast row from every eval in metrics.jsonl so far, or None while there are fewer than
        ``min_evals``. ``total_steps``: the run's planned steps (the target compute is extrapolated to them; None:
        the last eval's compute)."""
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unparseable tail lines of a file being written are expected here
            curve = load_run(self.run_dir, compute_key=self.compute_key)
        if curve.compute.size < self.min_evals:
            return None
        step, compute = int(curve.step[-1]), float(curve.compute[-1])
        target = target_compute(compute, step, total_steps) if total_steps else compute
        if not math.isfinite(target):
            target = compute
        warm = self._init is not None
        n = int(curve.compute.size)
        adapt = self._adapt if self.warm_warmup and n <= self.WARM_GROWTH * self._adapted_on else None
        post, notes = self._fit(curve, self._init, self.seed + 2 + self.n_fits, adapt)
        if adapt is None:
            self._adapted_on = n
        self.n_fits += 1
        s = post.summary()
        self._init = {k: v["median"] for k, v in s.items()}
        r_hat_max = max(post.r_hat.values(), default=float("nan"))
        healthy = post.num_divergences == 0 and (post.num_chains < 2 or r_hat_max <= self.WARM_RHAT_MAX)
        self._adapt = post.adaptation if healthy else None  # an unhealthy refit: the next one adapts from scratch
        row: dict = {"kind": "forecast", "step": step, "n_evals": int(curve.compute.size),
                     "compute_key": self.compute_key, "compute": compute, "target_compute": target,
                     "val_reward": float(curve.reward[-1])}
        for k in ("A", "B", "C_mid"):
            row[f"{k}_mean"], row[f"{k}_lo"], row[f"{k}_hi"] = s[k]["mean"], s[k]["lo"], s[k]["hi"]
        m, lo, hi = post.predict([target], interval=INTERVAL)
        row.update(R_target_mean=float(m[0]), R_target_lo=float(lo[0]), R_target_hi=float(hi[0]))
        n_last = None if curve.val_n is None else curve.val_n[-1]
        k_last = None if curve.val_k is None else curve.val_k[-1]
        row["R_obs_lo"], row["R_obs_hi"] = observed_interval(post, target, n_last, k_last, seed=self.seed)
        row.update(divergences=int(post.num_divergences), r_hat_max=r_hat_max, warm_start=warm,
                   warm_adaptation=adapt is not None, warnings=len(notes))
        base = self.baseline()
        if base is not None:
            row.update(self._against(post, base))
        row["fit_seconds"] = time.perf_counter() - t0
        return row

    def _against(self, post: SigmoidPosterior, base: SigmoidPosterior) -> dict:
        """P(A > A_baseline) and P(B > B_baseline); where the two mean A's lie within the paper's margin, B is
        compared at a shared A (both curves refitted with A fixed at the mean of the two), as the paper does."""
        a, a_base = post.samples["A"], base.samples["A"]
        out = {"baseline_A_mean": float(np.mean(a_base)), "baseline_B_mean": float(np.mean(base.samples["B"])),
               "P_A_gt_baseline": prob_greater(a, a_base), "P_B_gt_baseline": prob_greater(post.samples["B"],
                                                                                            base.samples["B"])}
        d_a = float(np.mean(a) - np.mean(a_base))
        out["baseline_rule"] = "A" if abs(d_a) > A_MARGIN else "B at shared A"
        if out["baseline_rule"] != "A":
            shared = float(0.5 * (np.mean(a) + np.mean(a_base)))
            curves = []
            for p in (post, base):
                d = {"compute": p.compute, "reward": p.reward, "A": shared}
                d.update({k: v for k, v in p.inputs.items() if v is not None})
                curves.append(d)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if curves[0].keys() == curves[1].keys():
                    q1, q2 = fit_bayes_batch(curves, seed=self.seed + 3, **self.nuts)
                else:  # different likelihood variants cannot share one sampler
                    q1 = fit_bayes_batch(curves[:1], seed=self.seed + 3, **self.nuts)[0]
                    q2 = fit_bayes_batch(curves[1:], seed=self.seed + 4, **self.nuts)[0]
            out.update(baseline_A_shared=shared, P_B_gt_baseline=prob_greater(q1.samples["B"], q2.samples["B"]))
        return out


def stop_reason(row: dict, stop_if_worse: float | None, stop_min_evals: int) -> str | None:
    """Why a run should stop after this forecast row under ``--stop-if-worse P``, or None: P(A < A_baseline) >= P
    with at least ``stop_min_evals`` evals fitted."""
    if stop_if_worse is None or "P_A_gt_baseline" not in row or row.get("n_evals", 0) < stop_min_evals:
        return None
    p_worse = 1.0 - float(row["P_A_gt_baseline"])
    if p_worse < stop_if_worse:
        return None
    return (f"stopped at step {row['step']} by --stop-if-worse {stop_if_worse:g}: after {row['n_evals']} evals "
            f"P(A < A_baseline) = {p_worse:.3f} (A {row['A_mean']:.3f} [{row['A_lo']:.3f}, {row['A_hi']:.3f}] vs "
            f"the baseline's {row['baseline_A_mean']:.3f})")


class StopRule:
    """``--stop-if-worse``: :func:`stop_reason` on each forecast row in turn; the run stops once ``confirmations``
    consecutive rows meet it (one refit's verdict on a loosely pinned A can swing back at the next)."""

    def __init__(self, stop_if_worse: float | None, stop_min_evals: int, confirmations: int = 2) -> None:
        self.p, self.min_evals, self.confirmations = stop_if_worse, int(stop_min_evals), int(confirmations)
        self.votes = 0  # consecutive rows that met the rule so far

    def update(self, row: dict) -> tuple[str | None, str | None]:
        """(why the run stops now or None, a note that the rule held but waits for confirmation or None)."""
        why = stop_reason(row, self.p, self.min_evals)
        self.votes = self.votes + 1 if why is not None else 0
        if why is None:
            return None, None
        if self.votes < self.confirmations:
            return None, (f"the stop rule holds at step {row['step']} ({self.votes} of {self.confirmations} "
                          "consecutive forecasts needed)")
        return (f"{why}; {self.confirmations} consecutive forecasts agreed" if self.confirmations > 1 else why), None


def forecast_history(rows: list[dict], final_compute: float | None, final_reward: float | None) -> dict | None:
    """How the forecast moved: per row the compute, A's interval and the predicted final reward; and, given the
    run's observed final reward, from which compute on every later forecast's 90 % interval of the final eval's
    measured value (``R_obs_lo`` / ``R_obs_hi``: the mean curve's interval widened by the eval's own noise; rows
    without them: the mean curve's interval) held it. None without forecast rows."""
    rows = sorted((r for r in rows if r.get("kind") == "forecast"), key=lambda r: r["compute"])
    if not rows:
        return None
    out = {"n": len(rows), "compute": [r["compute"] for r in rows],
           **{k: [r[k] for r in rows] for k in ("A_mean", "A_lo", "A_hi", "R_target_mean", "R_target_lo",
                                                 "R_target_hi", "target_compute")},
           "R_obs_lo": [r.get("R_obs_lo", r["R_target_lo"]) for r in rows],
           "R_obs_hi": [r.get("R_obs_hi", r["R_target_hi"]) for r in rows],
           "final_compute": final_compute, "final_reward": final_reward, "held_from_compute": None,
           "held_from_fraction": None}
    if final_reward is not None and math.isfinite(final_reward):
        held = [lo <= final_reward <= hi for lo, hi in zip(out["R_obs_lo"], out["R_obs_hi"], strict=True)]
        first = None
        for i in range(len(rows) - 1, -1, -1):  # the earliest row from which on every interval held the value
            if not held[i]:
                break
            first = i
        if first is not None:
            out["held_from_compute"] = rows[first]["compute"]
            if final_compute:
                out["held_from_fraction"] = rows[first]["compute"] / final_compute
    return out
