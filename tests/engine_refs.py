"""Engine references the engine tests share: random params built with NumPy, the padded sequence length of the
reference passes, and the hand-built mixed-version KV-cache reference of an in-flight weight swap."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.models import forward_cached, init_cache, lm_logits, param_shapes


def np_params(cfg, seed, std=0.1):
    """Random params built with NumPy (no per-op JAX compiles): N(0, std) matrices, unit norms."""
    rng = np.random.default_rng(seed)

    def leaf(name, shape):
        return np.ones(shape, np.float32) if "norm" in name else std * rng.standard_normal(shape).astype(np.float32)

    return {k: ({kk: leaf(kk, vv) for kk, vv in v.items()} if isinstance(v, dict) else leaf(k, v))
            for k, v in param_shapes(cfg).items()}


PAD_T = 32  # reference passes run on sequences right-padded to PAD_T (causal: padding never changes them)


@functools.partial(jax.jit, static_argnames=("cfg", "new_len"))
def mixed_cache_logp(old, new, tokens_T, cut, temperature, *, cfg, new_len):
    """Hand-built in-flight-update reference: the old params fill the KV cache for positions < ``cut`` (and, as
    padding, beyond it); the new params then run positions cut..cut+new_len-1 over that cache, overwriting
    their own slots before any query can see them. Returns log-softmax(logits / T) of both passes."""
    cache = init_cache(cfg, 1, tokens_T.shape[0])
    h_old, cache = forward_cached(old, tokens_T[None, :PAD_T], jnp.arange(PAD_T)[None], cache, cfg)
    seg = jax.lax.dynamic_slice(tokens_T, (cut,), (new_len,))
    h_new, _ = forward_cached(new, seg[None], (cut + jnp.arange(new_len))[None], cache, cfg)
    logp_old = jax.nn.log_softmax(lm_logits(old, h_old[0], cfg) / temperature, -1)
    logp_new = jax.nn.log_softmax(lm_logits(new, h_new[0], cfg) / temperature, -1)
    return logp_old, logp_new
