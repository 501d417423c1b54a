"""Bayesian fit of the ScaleRL law with NumPyro NUTS.

Priors (weak but proper; stated again in ``fit_bayes``'s docstring):

- R0: fixed to the value given, or, when ``R0=None``, Uniform(0, 1).
- A: Uniform(R0, 1) -- the ceiling lies between the start and a perfect pass rate.
- B: log B ~ Normal(log 1.5, 1); 90 % of the prior mass in [0.29, 7.8], the paper's B are 1.1-2.4.
- C_mid: log C_mid ~ Normal((log c_min + log c_max) / 2, s) with c_min / c_max the smallest positive /
  largest fitted compute and s = max(2, log(c_max / c_min)): centred on the observed range, its 90 %
  mass reaches well below the first point and far beyond the last, so C_mid may lie beyond the window.
- Noise, when eval counts are known (``n_prompts`` x ``k_samples``): a pass rate averaged over
  n prompts with k samples each, where prompts differ in difficulty, has variance
  ``mu (1 - mu) / (n k) * d`` with d = 1 + (k - 1) rho >= 1 (rho: within-prompt correlation); d is
  fitted with log d ~ HalfNormal(2), which also lets d exceed k to absorb policy fluctuation
  between evaluations. With ~10^4 draws per point the Normal form of this binomial-like
  likelihood is accurate.
- Noise otherwise: Normal with sigma ~ HalfNormal(0.1).
- Drift between evals: the standardised residuals z_i = (reward_i - mu_i) / sd_i of consecutive evals form an
  AR(1), z_i | z_{i-1} ~ Normal(rho z_{i-1}, 1 - rho^2), with rho = 0.95 u, u ~ Beta(1, 2) (``correlated=False``:
  rho = 0, independent evals). Each eval keeps its marginal sd (the predictive band of one eval is unchanged in
  form); a policy that drifts between evals makes the curve's parameters as uncertain as the fewer independent
  evals it amounts to. Chosen on simulated curves (tests/scaling/test_scaling_bayes.py), before the calibration
  study of the stored runs (docs/results/calibration.md) was run with it.

Parameters are sampled in standardised coordinates (unit-scale normals, a logit for A) so that NUTS
sees the same geometry whatever the compute unit, and one compiled sampler serves every data set of
the same padded size.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.infer.hmc import hmc

from .checks import ScalingFitWarning, check_fit_data
from .law import sigmoid_reward

__all__ = ["RHAT_WARN", "SigmoidPosterior", "fit_bayes", "fit_bayes_batch"]

RHAT_WARN = 1.01
B_PRIOR_LOC = float(np.log(1.5))
B_PRIOR_SCALE = 1.0
SIGMA_PRIOR_SCALE = 0.1
LOG_DISP_PRIOR_SCALE = 2.0
# The lag-one correlation of consecutive evals' residuals: rho = RHO_MAX x Beta(RHO_PRIOR), mean 0.32
RHO_PRIOR = (1.0, 2.0)
RHO_MAX = 0.95
# Data are padded to a multiple of this many points (masked out of the likelihood) so that curves of
# nearby lengths share one compiled sampler.
PAD_MULTIPLE = 32


def _model(logc, positive, reward, mask, nk, kk, r0_fixed, a_fixed, logc_loc, logc_scale, rho_max, *, fit_r0, counts,
           fix_a):
    """The generative model; the keyword flags select the variant and are fixed per compiled sampler."""
    if fit_r0:
        r0 = numpyro.sample("R0", dist.Uniform(0.0, 1.0))
    else:
        r0 = r0_fixed
    if fix_a:
        a = a_fixed
    else:
        u = numpyro.sample("u_A", dist.Uniform(0.0, 1.0))
        a = numpyro.deterministic("A", r0 + (1.0 - r0) * u)
    z_b = numpyro.sample("z_B", dist.Normal(0.0, 1.0))
    b = numpyro.deterministic("B", jnp.exp(B_PRIOR_LOC + B_PRIOR_SCALE * z_b))
    z_c = numpyro.sample("z_C", dist.Normal(0.0, 1.0))
    log_cmid = logc_loc + logc_scale * z_c
    numpyro.deterministic("C_mid", jnp.exp(log_cmid))
    frac = jnp.where(positive, jax.nn.sigmoid(b * (logc - log_cmid)), 0.0)
    eval_likelihood(r0 + (a - r0) * frac, reward, mask, nk, rho_max, counts=counts)
    del kk  # k enters only through the interpretation of the dispersion d = 1 + (k - 1) rho


def eval_likelihood(mu, reward, mask, nk, rho_max, *, counts: bool) -> None:
    """The evals around their mean curve ``mu`` (any leading axes; evals along the last): the eval noise (an
    over-dispersed binomial at ``nk`` draws, or one normal sigma) and the AR(1) of consecutive evals' residuals,
    shared by this module's model and the seeds' pooled one (scaling/seeds.py)."""
    if counts:
        log_d = numpyro.sample("log_disp", dist.HalfNormal(LOG_DISP_PRIOR_SCALE))
        numpyro.deterministic("dispersion", jnp.exp(log_d))
        # Floor mu(1 - mu) at one success in n k draws so a curve touching 0 or 1 keeps a finite variance.
        var = jnp.maximum(mu * (1.0 - mu), 1.0 / nk) / nk * jnp.exp(log_d)
        sd = jnp.sqrt(var)
    else:
        sd = numpyro.sample("sigma", dist.HalfNormal(SIGMA_PRIOR_SCALE))
    # Consecutive evals drift together: each eval's standardised residual is an AR(1) of the previous one's
    # (marginal sd unchanged), so a run of evals above or below the curve counts as less evidence than as many
    # independent ones, and the curve's parameters are as uncertain as that makes them.
    rho = numpyro.deterministic("rho", rho_max * numpyro.sample("rho_u", dist.Beta(RHO_PRIOR[0], RHO_PRIOR[1])))
    z = (reward - mu) / sd
    after = jnp.broadcast_to(jnp.arange(z.shape[-1]) > 0, z.shape)
    z_prev = jnp.concatenate([jnp.zeros_like(z[..., :1]), z[..., :-1]], axis=-1)
    loc = mu + jnp.where(after, rho * sd * z_prev, 0.0)
    scale = sd * jnp.where(after, jnp.sqrt(1.0 - rho**2), 1.0)
    with numpyro.handlers.mask(mask=mask):
        numpyro.sample("obs", dist.Normal(loc, scale), obs=reward)


_SITES_COMMON = ("z_B", "z_C")


def _latent_sites(fit_r0: bool, counts: bool, fix_a: bool) -> tuple[str, ...]:
    sites = list(_SITES_COMMON)
    if fit_r0:
        sites.append("R0")
    if not fix_a:
        sites.append("u_A")
    sites.append("log_disp" if counts else "sigma")
    sites.append("rho_u")
    return tuple(sites)


@functools.lru_cache(maxsize=32)
def _runner(fit_r0: bool, counts: bool, fix_a: bool, num_warmup: int, num_samples: int):
    """The jitted NUTS run of one model variant (:func:`build_runner`)."""
    model = functools.partial(_model, fit_r0=fit_r0, counts=counts, fix_a=fix_a)
    return build_runner(model, {s: () for s in _latent_sites(fit_r0, counts, fix_a)}, num_warmup, num_samples)


def build_runner(model, site_shapes: dict, num_warmup: int, num_samples: int, target_accept: float = 0.9):
    """A jitted NUTS run of ``model`` over a batch of lanes (data set x chain), each lane with its own data and
    adaptation; ``site_shapes``: each latent site's shape (``()`` for a scalar); ``target_accept``: the step size's
    adaptation target (higher: smaller steps, for posteriors with tight corners).

    numpyro's MCMC class vectorises chains over one data set; driving its functional kernel
    (``numpyro.infer.hmc.hmc``) under ``vmap`` instead lets many data sets (the calibration study,
    several runs) share one compiled sampler and one pass of the while-loops.
    """
    sites = tuple(site_shapes)

    def potential_fn_gen(*args):
        return lambda z: -_log_density(model, args, z)

    init_kernel, sample_kernel = hmc(potential_fn_gen=potential_fn_gen, algo="NUTS")

    def one_lane(key, z0, args, step_size, inv_mass):
        state = init_kernel(z0, num_warmup, step_size=step_size, inverse_mass_matrix=inv_mass,
                            target_accept_prob=target_accept, model_args=args, rng_key=key)

        def warm(state, _):
            return sample_kernel(state, model_args=args), None

        def draw(state, _):
            state = sample_kernel(state, model_args=args)
            return state, (state.z, state.diverging, state.num_steps)

        state, _ = jax.lax.scan(warm, state, None, length=num_warmup)
        adapted = (state.adapt_state.step_size, state.adapt_state.inverse_mass_matrix)
        _, (zs, div, steps) = jax.lax.scan(draw, state, None, length=num_samples)
        values = jax.vmap(lambda z: _constrained(model, args, z))(zs)
        return values, div, steps, adapted

    @jax.jit
    def run(keys, args, center, spread, step_size, inv_mass):
        z0_keys = jax.vmap(lambda k: jax.random.split(k, len(sites)))(keys)
        # Uniform in [center - spread, center + spread] in the standardised unconstrained coordinates. A cold
        # start (center 0, spread 1.5) spreads the chains over the prior's bulk, so disagreeing chains show up
        # in r_hat instead of all starting at one point; a warm start centres them on an earlier fit's medians.
        z0 = {}
        for i, s in enumerate(sites):
            shape = tuple(site_shapes[s])
            u = jax.vmap(lambda k: jax.random.uniform(k, shape, minval=-1.0, maxval=1.0))(z0_keys[:, i])
            z0[s] = center[s] + u * jnp.reshape(spread, (-1,) + (1,) * len(shape))
        return jax.vmap(one_lane)(keys, z0, args, step_size, inv_mass)

    return run


def _log_density(model, args, z):
    """Joint log density at unconstrained ``z``, with the Jacobians of the constraining transforms."""
    return numpyro.infer.util.potential_energy(model, args, {}, z) * -1.0


def _constrained(model, args, z):
    """All sample and deterministic sites at unconstrained ``z``, in constrained space."""
    params = numpyro.infer.util.constrain_fn(model, args, {}, z, return_deterministic=True)
    return params


@dataclasses.dataclass
class SigmoidPosterior:
    """Posterior samples of the law's parameters and their diagnostics.

    Attributes:
        samples: dict of 1-D numpy arrays "A", "B", "C_mid" (and "R0" when it was fitted), chains
            concatenated; also "sigma" or "dispersion" for the noise model.
        R0: the fixed starting reward, or None when R0 was fitted.
        r_hat, ess: split R-hat and effective sample size per parameter.
        num_divergences: divergent NUTS transitions after warm-up (should be 0).
        likelihood: "counts" (binomial-like with over-dispersion) or "normal".
        compute, reward: the data the fit used.
    """

    samples: dict
    R0: float | None
    r_hat: dict
    ess: dict
    num_divergences: int
    likelihood: str
    num_chains: int
    compute: np.ndarray
    reward: np.ndarray
    inputs: dict = dataclasses.field(default_factory=dict)  # R0 / n_prompts / k_samples as passed, for refits
    #: each chain's adapted NUTS step size and diagonal inverse mass matrix (and the model variant's flags): a
    #: later fit of the same model can start from them (``fit_bayes(adaptation=...)``)
    adaptation: dict | None = None

    def _param(self, name: str) -> np.ndarray:
        if name == "R0" and "R0" not in self.samples:
            return np.full_like(self.samples["A"], self.R0)
        return self.samples[name]

    def summary(self, interval: float = 0.9) -> dict:
        """{"A": {"mean", "median", "lo", "hi"}, ...}: lo/hi bound the central ``interval`` (default 90 %)."""
        q = (1.0 - interval) / 2.0
        out = {}
        for name in ("A", "B", "C_mid", "R0", "sigma", "dispersion", "rho"):
            if name not in self.samples:
                continue
            x = self.samples[name]
            out[name] = {
                "mean": float(np.mean(x)),
                "median": float(np.median(x)),
                "lo": float(np.quantile(x, q)),
                "hi": float(np.quantile(x, 1.0 - q)),
            }
        return out

    def curves(self, compute, max_samples: int | None = 2000) -> np.ndarray:
        """R(compute) for (up to ``max_samples`` evenly thinned) posterior samples: [samples, len(compute)]."""
        c = np.atleast_1d(np.asarray(compute, dtype=float))
        n = self.samples["A"].size
        if max_samples is None or n <= max_samples:
            idx = np.arange(n)
        else:
            idx = np.linspace(0, n - 1, max_samples).astype(int)
        A, B, Cm, R0 = (self._param(k)[idx, None] for k in ("A", "B", "C_mid", "R0"))
        return sigmoid_reward(c[None, :], A, B, Cm, R0)

    def predict(self, compute, interval: float = 0.9):
        """Posterior of the mean curve at ``compute``: (mean, lo, hi) arrays, lo/hi the central ``interval``."""
        r = self.curves(compute, max_samples=None)
        q = (1.0 - interval) / 2.0
        return r.mean(axis=0), np.quantile(r, q, axis=0), np.quantile(r, 1.0 - q, axis=0)

    def to_dict(self) -> dict:
        """JSON-ready summary with diagnostics."""
        return {
            "summary": self.summary(),
            "R0_fixed": self.R0,
            "likelihood": self.likelihood,
            "r_hat": {k: float(v) for k, v in self.r_hat.items()},
            "ess": {k: float(v) for k, v in self.ess.items()},
            "num_divergences": int(self.num_divergences),
            "num_samples": int(self.samples["A"].size),
            "num_chains": int(self.num_chains),
        }


def _per_point(value, n: int, label: str) -> np.ndarray | None:
    if value is None:
        return None
    x = np.broadcast_to(np.asarray(value, dtype=float), (n,)).copy()
    if not np.all(np.isfinite(x)) or np.any(x < 1):
        raise ValueError(f"{label} must be finite and >= 1 (a count), got {value!r}")
    return x


@dataclasses.dataclass
class _Prepared:
    flags: tuple  # (fit_r0, counts, fix_a)
    columns: dict  # unpadded per-point arrays
    scalars: dict
    r0: float | None
    a_fixed: float | None
    compute: np.ndarray
    reward: np.ndarray
    inputs: dict


def _prepare(compute, reward, R0, n_prompts, k_samples, A, exclude_below, name="fit_bayes",
             correlated: bool = True) -> _Prepared:
    # stacklevel 4: a flat-curve warning names fit_bayes' line, not this helper's
    c, r, r0_value, keep = check_fit_data(compute, reward, R0, exclude_below=exclude_below, name=name,
                                          allow_fitted_R0=True, stacklevel=4)
    if (n_prompts is None) != (k_samples is None):
        raise ValueError(f"{name}: pass both n_prompts and k_samples (val_n, val_k) or neither")
    n_p = _per_point(n_prompts, keep.size, "n_prompts")
    k_s = _per_point(k_samples, keep.size, "k_samples")
    counts = n_p is not None
    if A is not None:
        A = float(A)
        if not (r0_value if r0_value is not None else 0.0) <= A <= 1.0:
            raise ValueError(f"{name}: fixed A={A} must lie in [R0, 1]")
    pos = c > 0
    c_min, c_max = float(c[pos].min()), float(c.max())
    columns = {
        "logc": np.log(np.where(pos, c, 1.0)),
        "positive": pos,
        "reward": r,
        "mask": np.ones(c.size, bool),
        "nk": (n_p * k_s)[keep] if counts else np.ones(c.size),
        "kk": k_s[keep] if counts else np.ones(c.size),
    }
    scalars = {
        "r0": 0.0 if r0_value is None else r0_value,
        "a": 0.0 if A is None else A,
        "logc_loc": float(0.5 * (np.log(c_min) + np.log(c_max))),
        "logc_scale": max(2.0, float(np.log(c_max / c_min))),
        "rho_max": RHO_MAX if correlated else 0.0,
    }
    inputs = {
        "R0": r0_value,
        "n_prompts": None if n_p is None else n_p[keep],
        "k_samples": None if k_s is None else k_s[keep],
    }
    return _Prepared((r0_value is None, counts, A is not None), columns, scalars, r0_value, A, c, r, inputs)


_PAD_FILL = {"logc": 0.0, "positive": True, "reward": 0.5, "mask": False, "nk": 1.0, "kk": 1.0}
_COLUMN_ORDER = ("logc", "positive", "reward", "mask", "nk", "kk")


def _stack_args(preps: list[_Prepared], num_chains: int):
    """Model arguments for every lane (data set x chain), data padded to a shared multiple of PAD_MULTIPLE."""
    n = max(p.reward.size for p in preps)
    size = -(-n // PAD_MULTIPLE) * PAD_MULTIPLE
    cols = []
    for name in _COLUMN_ORDER:
        rows = []
        for p in preps:
            x = p.columns[name]
            rows.append(np.concatenate([x, np.full(size - x.size, _PAD_FILL[name], dtype=x.dtype)]))
        cols.append(jnp.asarray(np.repeat(np.stack(rows), num_chains, axis=0)))
    scal = [
        jnp.asarray(np.repeat(np.array([p.scalars[k] for p in preps], dtype=float), num_chains))
        for k in ("r0", "a", "logc_loc", "logc_scale", "rho_max")
    ]
    return tuple(cols + scal)


def _check_run_args(num_samples, num_chains, num_warmup):
    if int(num_samples) < 10 or int(num_chains) < 1:
        raise ValueError("fit_bayes: need num_samples >= 10 and num_chains >= 1")
    return int(num_samples), int(num_chains), int(min(num_samples, 500) if num_warmup is None else num_warmup)


COLD_SPREAD = 1.5  # a cold start draws each unconstrained coordinate uniformly within +-1.5 of its centre
WARM_SPREAD = 0.25  # a warm start: within +-0.25 of the earlier fit's median (chains still start apart)


def _logit(p: float) -> float:
    p = min(max(float(p), 1e-4), 1.0 - 1e-4)
    return float(np.log(p / (1.0 - p)))


def _start_point(prep: _Prepared, init: dict | None) -> tuple[dict, float]:
    """The chains' starting centre in the sampler's unconstrained coordinates, and their spread around it.

    ``init`` (a warm start): constrained values of an earlier fit ("A", "B", "C_mid", "rho" and, where this fit
    samples them, "R0", "dispersion" or "sigma"), e.g. its posterior medians; None or a missing value: the cold
    start."""
    fit_r0, counts, fix_a = prep.flags
    centre = {s: 0.0 for s in _latent_sites(fit_r0, counts, fix_a)}
    if not counts:
        centre["sigma"] = float(np.log(0.02))
    if not init:
        return centre, COLD_SPREAD
    sc = prep.scalars

    def have(k):
        v = init.get(k)
        return v is not None and np.isfinite(v)

    if have("B") and init["B"] > 0:
        centre["z_B"] = (float(np.log(init["B"])) - B_PRIOR_LOC) / B_PRIOR_SCALE
    if have("C_mid") and init["C_mid"] > 0:
        centre["z_C"] = (float(np.log(init["C_mid"])) - sc["logc_loc"]) / sc["logc_scale"]
    r0 = sc["r0"]
    if fit_r0 and have("R0"):
        centre["R0"] = _logit(init["R0"])
        r0 = float(init["R0"])
    if not fix_a and have("A") and r0 < 1.0:
        centre["u_A"] = _logit((init["A"] - r0) / (1.0 - r0))
    if counts and have("dispersion"):
        centre["log_disp"] = float(np.log(max(np.log(max(init["dispersion"], 1.0)), 1e-3)))
    if not counts and have("sigma") and init["sigma"] > 0:
        centre["sigma"] = float(np.log(init["sigma"]))
    if have("rho"):
        centre["rho_u"] = _logit(init["rho"] / RHO_MAX)
    return centre, WARM_SPREAD


def _start_adaptation(prep: _Prepared, adaptation: dict | None, num_chains: int) -> tuple[np.ndarray, np.ndarray]:
    """Each chain's initial step size and diagonal inverse mass matrix: an earlier fit's adapted ones (its
    ``SigmoidPosterior.adaptation``, if it sampled the same sites with as many chains), else numpyro's cold start
    (1.0 and the identity)."""
    d = len(_latent_sites(*prep.flags))
    if adaptation is not None and adaptation.get("flags") == prep.flags:
        step, inv = np.asarray(adaptation["step_size"], float), np.asarray(adaptation["inverse_mass_matrix"], float)
        if step.shape == (num_chains,) and inv.shape == (num_chains, d) and np.all(np.isfinite(step)) \
                and np.all(step > 0) and np.all(np.isfinite(inv)) and np.all(inv > 0):
            return step, inv
    return np.ones(num_chains), np.ones((num_chains, d))


def _run_batch(preps: list[_Prepared], seed, num_samples, num_chains, num_warmup,
               inits: list[dict | None] | None = None,
               adaptations: list[dict | None] | None = None) -> list[SigmoidPosterior]:
    flags = preps[0].flags
    if any(p.flags != flags for p in preps):
        raise ValueError("fit_bayes_batch: all data sets must agree on R0 fixed/fitted, counts given or not, and A")
    fit_r0, counts, fix_a = flags
    run = _runner(fit_r0, counts, fix_a, num_warmup, num_samples)
    args = _stack_args(preps, num_chains)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(preps) * num_chains)
    starts = [_start_point(p, None if inits is None else inits[i]) for i, p in enumerate(preps)]
    center = {s: jnp.asarray(np.repeat([c[s] for c, _ in starts], num_chains))
              for s in _latent_sites(fit_r0, counts, fix_a)}
    spread = jnp.asarray(np.repeat([w for _, w in starts], num_chains))
    adapt0 = [_start_adaptation(p, None if adaptations is None else adaptations[i], num_chains)
              for i, p in enumerate(preps)]
    step0 = jnp.asarray(np.concatenate([a[0] for a in adapt0]), jnp.float32)
    inv0 = jnp.asarray(np.concatenate([a[1] for a in adapt0]), jnp.float32)
    values, div, _, (step_adapted, inv_adapted) = run(keys, args, center, spread, step0, inv0)
    step_adapted, inv_adapted = np.asarray(step_adapted, float), np.asarray(inv_adapted, float)
    values = {k: np.asarray(v, dtype=float) for k, v in values.items()}
    div = np.asarray(div)
    names = (["B", "C_mid"] if fix_a else ["A", "B", "C_mid"]) + (["R0"] if fit_r0 else [])
    names += ["dispersion" if counts else "sigma", "rho"]
    out = []
    for d, p in enumerate(preps):
        lanes = slice(d * num_chains, (d + 1) * num_chains)
        samples, r_hat, ess = {}, {}, {}
        for name in names:
            x = values[name][lanes]  # [chains, draws]
            samples[name] = x.reshape(-1)
            if num_chains > 1:
                r_hat[name] = float(split_gelman_rubin(x))
            ess[name] = float(effective_sample_size(x))
        if fix_a:
            samples["A"] = np.full(samples["B"].size, p.a_fixed)
        out.append(
            SigmoidPosterior(
                samples=samples,
                R0=p.r0,
                r_hat=r_hat,
                ess=ess,
                num_divergences=int(div[lanes].sum()),
                likelihood="counts" if counts else "normal",
                num_chains=num_chains,
                compute=p.compute,
                reward=p.reward,
                inputs=p.inputs,
                adaptation={"flags": flags, "step_size": step_adapted[lanes],
                            "inverse_mass_matrix": inv_adapted[lanes]},
            )
        )
    return out


def _warn_diagnostics(post: SigmoidPosterior, name: str, stacklevel: int = 3) -> None:
    bad = {k: round(v, 3) for k, v in post.r_hat.items() if not v <= RHAT_WARN}
    if bad:
        warnings.warn(
            f"{name}: r_hat above {RHAT_WARN} for {bad}; chains disagree, run more samples or check the data",
            ScalingFitWarning,
            stacklevel=stacklevel,
        )
    if post.num_divergences:
        warnings.warn(
            f"{name}: {post.num_divergences} divergent transitions; the posterior may be biased near them",
            ScalingFitWarning,
            stacklevel=stacklevel,
        )
    if np.mean(post.samples["A"] > 0.99) > 0.25:
        warnings.warn(
            f"{name}: much of the posterior puts A near its upper bound 1; the data do not reach the bend of the "
            "curve, so the ceiling is not identified (fit on more compute)",
            ScalingFitWarning,
            stacklevel=stacklevel,
        )


def fit_bayes(
    compute,
    reward,
    R0=None,
    *,
    seed: int = 0,
    num_samples: int = 1000,
    num_chains: int = 4,
    num_warmup: int | None = None,
    n_prompts=None,
    k_samples=None,
    A=None,
    exclude_below: float = 0.0,
    init: dict | None = None,
    correlated: bool = True,
    adaptation: dict | None = None,
) -> SigmoidPosterior:
    """Posterior over the ScaleRL law's parameters with NumPyro NUTS (chains vectorised on one device).

    Model: ``reward_i ~ Normal(R(C_i; A, B, C_mid, R0), sd_i)`` with the law of RECIPE.md section 1.

    Priors (weak but proper):
        - R0: fixed to ``R0`` when given; otherwise Uniform(0, 1) and fitted (include the step-0
          evaluation then, it pins R0).
        - A ~ Uniform(R0, 1). Pass ``A=`` to fix it instead (used to compare B at a shared A).
        - log B ~ Normal(log 1.5, 1).
        - log C_mid ~ Normal((log c_min + log c_max) / 2, max(2, log(c_max / c_min))), c_min / c_max
          the smallest positive / largest fitted compute: covers the observed range and far beyond it.
        - With ``n_prompts`` and ``k_samples`` (the eval rows' val_n, val_k; scalars or per point):
          sd_i^2 = mu_i (1 - mu_i) / (n k) * d, the variance of a mean of n binomial(k, p_j) counts
          whose p_j vary over prompts (d = 1 + (k - 1) rho), with log d ~ HalfNormal(2).
        - Otherwise sd_i = sigma ~ HalfNormal(0.1).
        - Consecutive evals' residuals are correlated (``correlated``): z_i = (reward_i - R_i) / sd_i is an
          AR(1), z_i | z_{i-1} ~ Normal(rho z_{i-1}, 1 - rho^2), rho = 0.95 u with u ~ Beta(1, 2) (mean 0.32):
          each eval keeps its marginal sd, and a stretch of evals on one side of the curve (the policy drifting
          between evals) weighs as the fewer independent evals it is worth.

    Args:
        compute, reward: the curve (reward a pass rate in [0, 1]; compute strictly increasing).
        R0: starting reward, or None to fit it.
        seed: PRNG seed. num_samples, num_chains: kept draws per chain and chain count.
        num_warmup: adaptation steps per chain (default: min(num_samples, 500)).
        n_prompts, k_samples: val_n and val_k of the eval rows; select the binomial-like likelihood.
        A: fix the ceiling instead of fitting it.
        exclude_below: drop points with compute below this (the paper's early-phase cut).
        init: a warm start, e.g. an earlier fit's posterior medians ({"A", "B", "C_mid", ...} in the model's own
            units): the chains start within a small box around it instead of over the prior's bulk (the live
            forecast refits a growing curve this way).
        correlated: fit the residuals' lag-one correlation (default); False treats evals as independent (rho 0).
        adaptation: an earlier fit's ``SigmoidPosterior.adaptation`` (same model variant and chain count): each
            chain starts from its adapted step size and mass matrix instead of the identity. With ``num_warmup``
            below 20, numpyro's warm-up is one window that tunes the step size only and keeps that mass matrix:
            the live forecast's cheap refit of a curve that grew by an eval (ignored if it does not match).

    Returns a SigmoidPosterior; warns (ScalingFitWarning) when any R-hat exceeds 1.01, NUTS diverged,
    or the ceiling runs into its bound.
    """
    num_samples, num_chains, num_warmup = _check_run_args(num_samples, num_chains, num_warmup)
    prep = _prepare(compute, reward, R0, n_prompts, k_samples, A, exclude_below, correlated=correlated)
    post = _run_batch([prep], seed, num_samples, num_chains, num_warmup, inits=[init], adaptations=[adaptation])[0]
    _warn_diagnostics(post, "fit_bayes")
    return post


def fit_bayes_batch(
    curves: list[dict],
    *,
    seed: int = 0,
    num_samples: int = 1000,
    num_chains: int = 4,
    num_warmup: int | None = None,
    exclude_below: float = 0.0,
    correlated: bool = True,
) -> list[SigmoidPosterior]:
    """``fit_bayes`` for many curves in one vectorised NUTS run (same priors, independent posteriors).

    Each entry of ``curves`` is a dict with keys "compute", "reward" and optionally "R0", "n_prompts",
    "k_samples", "A" (as in ``fit_bayes``); all entries must agree on which optional keys are given.
    Every (curve, chain) pair is one lane with its own step size and mass-matrix adaptation, so the
    result equals separate fits up to the random streams; the batch only shares compilation and loops.
    """
    if not curves:
        return []
    num_samples, num_chains, num_warmup = _check_run_args(num_samples, num_chains, num_warmup)
    preps = [
        _prepare(
            d["compute"], d["reward"], d.get("R0"), d.get("n_prompts"), d.get("k_samples"), d.get("A"),
            exclude_below, name=f"fit_bayes_batch[{i}]", correlated=correlated,
        )
        for i, d in enumerate(curves)
    ]
    posts = _run_batch(preps, seed, num_samples, num_chains, num_warmup)
    for i, post in enumerate(posts):
        _warn_diagnostics(post, f"fit_bayes_batch[{i}]")
    return posts


