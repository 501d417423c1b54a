"""A pooled fit across the seeds of one recipe: where another seed of it would end.

One seed's posterior says where *that* run goes; a user comparing two recipes needs where *a run* of each goes,
and seeds of one recipe differ (another warm start, other samples, another order of batches). The pooled fit
treats each seed's curve as the ScaleRL law with its own parameters drawn around the recipe's:

- per seed s: logit((A_s - R0_s) / (1 - R0_s)) = mu_A + sd_A e_A,s; log C_mid,s = c0 + w (mu_C + sd_C e_C,s), with
  e ~ Normal(0, 1) (non-centred) and c0, w the centre and width of the seeds' pooled compute range as in
  ``fit_bayes``; R0_s ~ Uniform(0, 1), pinned by each seed's step-0 eval; B shared: log B = log 1.5 + z_B.
- the recipe: mu_A ~ Logistic(0, 1) (for one seed, A ~ Uniform(R0, 1) as in ``fit_bayes``), z_B, mu_C ~ Normal(0,
  1); the seeds' spread sd_A ~ HalfNormal(0.5) (logit units), sd_C ~ HalfNormal(0.5) (units of w), weakly
  informative: two or three seeds cannot bound a spread by themselves.
- each eval: ``fit_bayes``'s likelihood (over-dispersed binomial at the eval's ``val_n x val_k``, or a fitted
  normal sigma; consecutive evals' standardised residuals an AR(1)), its dispersion and rho shared by the seeds
  (one recipe, one validation set).

Another seed's eval at compute c (:meth:`SeedsPosterior.new_seed_band`): for each posterior draw, a new seed's
e_A, e_C drawn from the recipe's spread, R0 that of a seed drawn from those fitted, its curve at c plus one
eval's noise. With few seeds the spread is uncertain and the band says so: the spread's posterior, not a point
estimate of it, widens the band.
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

from . import bayes
from .checks import ScalingFitWarning
from .law import sigmoid_reward

__all__ = ["SeedsPosterior", "fit_seeds_batch"]

# The seeds' spread, weakly informative. Two seeds' curves differed by sd 0.02 (tiny), 0.04-0.05 (small) and 0.12-0.19
# (tiny_chain) in the first halves of this project's stored studies (docs/results/calibration.md), RECIPE.md's
# by +-0.015 in A: about 0.1-0.9 in logit((A - R0) / (1 - R0)). HalfNormal(0.5) has its median at 0.34 and 90 % of
# its mass below 0.82; two or three seeds hardly bound a spread by themselves, so the prior matters there.
SD_A_PRIOR = 0.5
# In units of C_mid's prior width w (>= 2 in log C): HalfNormal(0.5), 90 % below 0.82 w
SD_C_PRIOR = 0.5
START_SPREAD = 0.5  # chains start uniformly within +-0.5 of the start point in unconstrained coordinates


def _model(logc, positive, reward, mask, nk, logc_loc, logc_scale, *, counts):
    """The pooled model; every data array is [seeds, points] (padded points masked out)."""
    n_seeds = reward.shape[0]
    mu_a = numpyro.sample("mu_A", dist.Logistic(0.0, 1.0))
    sd_a = numpyro.sample("sd_A", dist.HalfNormal(SD_A_PRIOR))
    z_b = numpyro.sample("z_B", dist.Normal(0.0, 1.0))
    mu_c = numpyro.sample("mu_C", dist.Normal(0.0, 1.0))
    sd_c = numpyro.sample("sd_C", dist.HalfNormal(SD_C_PRIOR))
    # non-centred offsets of each seed from the recipe
    e = numpyro.sample("e", dist.Normal(0.0, 1.0).expand([2, n_seeds]).to_event(2))
    r0 = numpyro.sample("R0", dist.Uniform(0.0, 1.0).expand([n_seeds]).to_event(1))
    a = numpyro.deterministic("A", r0 + (1.0 - r0) * jax.nn.sigmoid(mu_a + sd_a * e[0]))
    b = numpyro.deterministic("B", jnp.exp(bayes.B_PRIOR_LOC + bayes.B_PRIOR_SCALE * z_b) * jnp.ones(n_seeds))
    log_cmid = logc_loc + logc_scale * (mu_c + sd_c * e[1])
    numpyro.deterministic("C_mid", jnp.exp(log_cmid))
    frac = jnp.where(positive, jax.nn.sigmoid(b[:, None] * (logc - log_cmid[:, None])), 0.0)
    bayes.eval_likelihood(r0[:, None] + (a - r0)[:, None] * frac, reward, mask, nk, bayes.RHO_MAX, counts=counts)

def _site_shapes(counts: bool, n_seeds: int) -> dict:
    shapes = {"mu_A": (), "sd_A": (), "z_B": (), "mu_C": (), "sd_C": (), "e": (2, n_seeds),
              "R0": (n_seeds,)}
    shapes["log_disp" if counts else "sigma"] = ()
    shapes["rho_u"] = ()
    return shapes


@functools.lru_cache(maxsize=16)
def _runner(counts: bool, n_seeds: int, num_warmup: int, num_samples: int):
    model = functools.partial(_model, counts=counts)
    return bayes.build_runner(model, _site_shapes(counts, n_seeds), num_warmup, num_samples, target_accept=0.95)


#: the recipe-level parameters (diagnosed) and the per-seed ones kept with them
HYPER = ("mu_A", "sd_A", "z_B", "mu_C", "sd_C", "rho")
PER_SEED = ("A", "B", "C_mid", "R0")


@dataclasses.dataclass
class SeedsPosterior:
    """Posterior draws of a pooled fit: ``samples`` holds the recipe's HYPER parameters ([draws]), each seed's
    A, B, C_mid, R0 ([draws, seeds]) and "dispersion" or "sigma"; ``logc_loc`` / ``logc_scale`` place C_mid's
    standardised coordinate; r_hat / ess per recipe-level parameter (the worst over seeds for per-seed ones)."""

    samples: dict
    r_hat: dict
    ess: dict
    num_divergences: int
    likelihood: str
    num_chains: int
    n_seeds: int
    logc_loc: float
    logc_scale: float

    def new_seed_band(self, compute, nk=None, interval: float = 0.9, seed: int = 0, max_samples: int = 4000):
        """(lo, hi) of one eval of a new seed of the recipe at each ``compute`` (``nk``: that eval's val_n x val_k,
        needed by the counts likelihood): the recipe's spread draws the seed's parameters, then its eval noise."""
        c = np.atleast_1d(np.asarray(compute, dtype=float))
        n = self.samples["mu_A"].size
        idx = np.linspace(0, n - 1, min(n, max_samples)).astype(int)
        rng = np.random.default_rng(seed)
        g = {k: self.samples[k][idx, None] for k in HYPER}
        e = rng.standard_normal((2, idx.size, 1))
        r0 = self.samples["R0"][idx, rng.integers(0, self.n_seeds, idx.size)][:, None]
        a = r0 + (1.0 - r0) / (1.0 + np.exp(-(g["mu_A"] + g["sd_A"] * e[0])))
        b = np.exp(bayes.B_PRIOR_LOC + bayes.B_PRIOR_SCALE * g["z_B"])
        cmid = np.exp(self.logc_loc + self.logc_scale * (g["mu_C"] + g["sd_C"] * e[1]))
        mu = sigmoid_reward(c[None, :], a, b, cmid, r0)
        if self.likelihood == "counts":
            if nk is None:
                raise ValueError("new_seed_band: the counts likelihood needs each eval's val_n x val_k (nk)")
            nk = np.broadcast_to(np.asarray(nk, dtype=float), c.shape)[None, :]
            sd = np.sqrt(np.maximum(mu * (1.0 - mu), 1.0 / nk) / nk * self.samples["dispersion"][idx, None])
        else:
            sd = self.samples["sigma"][idx, None] * np.ones_like(mu)
        draws = mu + sd * rng.standard_normal(mu.shape)
        q = (1.0 - interval) / 2.0
        return np.quantile(draws, q, axis=0), np.quantile(draws, 1.0 - q, axis=0)


def _stack(preps: list, size: int) -> dict:
    """[seeds, size] columns of one pooled data set, each seed's points padded (masked out) to ``size``."""
    out = {}
    for name in ("logc", "positive", "reward", "mask", "nk"):
        out[name] = np.stack([np.concatenate([p.columns[name], np.full(size - p.reward.size, bayes._PAD_FILL[name],
                                                                           dtype=p.columns[name].dtype)])
                              for p in preps])
    return out


def fit_seeds_batch(groups: list[list[dict]], *, seed: int = 0, num_samples: int = 500, num_chains: int = 4,
                    num_warmup: int | None = None) -> list[SeedsPosterior]:
    """Pooled fits of several recipes (or leave-one-seed-out subsets of one) in one vectorised NUTS run.

    Each group is a list of one curve dict per seed ("compute", "reward" and, for the counts likelihood,
    "n_prompts" / "k_samples", as in ``fit_bayes``); every group must have as many seeds and agree on whether counts
    are given (one compiled sampler). Warns (ScalingFitWarning) on divergences or R-hat > 1.01."""
    if not groups:
        return []
    num_samples, num_chains, num_warmup = bayes._check_run_args(num_samples, num_chains, num_warmup)
    n_seeds = len(groups[0])
    if n_seeds < 1 or any(len(g) != n_seeds for g in groups):
        raise ValueError("fit_seeds_batch: every group needs the same number (>= 1) of seeds")
    preps = [[bayes._prepare(d["compute"], d["reward"], None, d.get("n_prompts"), d.get("k_samples"), None, 0.0,
                             name=f"fit_seeds[{gi}][{si}]") for si, d in enumerate(g)] for gi, g in enumerate(groups)]
    counts = preps[0][0].flags[1]
    if any(p.flags[1] != counts for g in preps for p in g):
        raise ValueError("fit_seeds_batch: give n_prompts / k_samples for every seed or for none")
    size = -(-max(p.reward.size for g in preps for p in g) // bayes.PAD_MULTIPLE) * bayes.PAD_MULTIPLE
    stacked, scal = [], []
    for g in preps:
        c = np.concatenate([p.compute[p.compute > 0] for p in g])
        lo, hi = float(np.log(c.min())), float(np.log(c.max()))
        stacked.append(_stack(g, size))
        scal.append((0.5 * (lo + hi), max(2.0, hi - lo)))
    rep = lambda x: jnp.asarray(np.repeat(np.asarray(x), num_chains, axis=0))  # noqa: E731
    args = tuple(rep([s[k] for s in stacked]) for k in ("logc", "positive", "reward", "mask", "nk"))
    args += (rep([s[0] for s in scal]), rep([s[1] for s in scal]))
    shapes = _site_shapes(counts, n_seeds)
    lanes = len(groups) * num_chains
    # chains start near the prior's centre (the law's midpoint in the seeds' compute range), each seed's R0 at its
    # first eval: a start spread over the prior's bulk, as fit_bayes's, lets a chain of this larger model settle
    # in a far mode (a midpoint far outside the data)
    center = {k: np.zeros((len(groups),) + tuple(v)) for k, v in shapes.items()}
    center["R0"] = np.array([[bayes._logit(p.reward[0]) for p in g] for g in preps])
    center = {k: jnp.asarray(np.repeat(v, num_chains, axis=0)) for k, v in center.items()}
    d = sum(int(np.prod(v)) for v in shapes.values())
    run = _runner(counts, n_seeds, num_warmup, num_samples)
    keys = jax.random.split(jax.random.PRNGKey(seed), lanes)
    values, div, _, _ = run(keys, args, center, jnp.full(lanes, START_SPREAD), jnp.ones(lanes),
                            jnp.ones((lanes, d)))
    values = {k: np.asarray(v, dtype=float) for k, v in values.items()}
    div = np.asarray(div)
    out = []
    for gi in range(len(groups)):
        sl = slice(gi * num_chains, (gi + 1) * num_chains)
        samples, r_hat, ess = {}, {}, {}
        for k in HYPER + PER_SEED + (("dispersion",) if counts else ("sigma",)):
            x = values[k][sl]  # [chains, draws] or [chains, draws, seeds]
            samples[k] = x.reshape((-1,) + x.shape[2:])
            if num_chains > 1:
                r_hat[k] = float(np.max(split_gelman_rubin(x)))
            ess[k] = float(np.min(effective_sample_size(x)))
        post = SeedsPosterior(samples, r_hat, ess, int(div[sl].sum()), "counts" if counts else "normal", num_chains,
                              n_seeds, *scal[gi])
        bad = {k: round(v, 3) for k, v in r_hat.items() if not v <= bayes.RHAT_WARN}
        if bad or post.num_divergences:
            warnings.warn(f"fit_seeds[{gi}]: r_hat {bad or 'fine'}, {post.num_divergences} divergent transitions; "
                          "the pooled posterior may be off", ScalingFitWarning, stacklevel=2)
        out.append(post)
    return out

