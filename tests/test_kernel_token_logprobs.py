"""The fused Pallas token log-prob kernel (scalerl_jax/kernels/token_logprobs.py) against its pure-JAX references.

On CPU everything runs in Pallas interpret mode; on a GPU the same tests compile the kernel (``interpret`` comes
from the ``pallas_interpret`` fixture: SCALERL_PALLAS_INTERPRET, see ``scalerl_jax/kernels/__init__.py``). Values and
gradients (w.r.t. h and W) equal the chunked reference and the naive full-logits computation on ragged shapes (rows,
vocabulary and D not multiples of their tiles, targets at the first and last vocabulary ids as padding positions
use), float32 and bfloat16 inputs, with a temperature; the traced program holds no [N, V]-sized array; the RL train
step with ``ModelConfig.logprobs_impl="pallas"`` equals the reference step; every unavailable combination is
refused with a message naming the field, never silently replaced by the reference.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.config import ConfigError, LossConfig, TrainConfig
from scalerl_jax.kernels.token_logprobs import token_logprobs as kernel_logprobs
from scalerl_jax.losses.logprobs import head_logprobs, token_logprobs, token_logprobs_naive
from scalerl_jax.models import init_params, tiny
from scalerl_jax.train import init_train_state, make_optimizer, make_train_step
from scalerl_jax.train.rl import rl_loss
from tests.tolerances import check_train_steps, head_reference, ops

SMALL = dict(block_rows=16, block_vocab=16, block_d=16)
LR = 1e-2  # the train-step comparison's learning rate


def _inputs(B, T, D, V, dtype, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    h = jax.random.normal(k1, (B, T, D), jnp.float32).astype(dtype)
    w = (jax.random.normal(k2, (D, V), jnp.float32) * 0.5).astype(dtype)
    tgt = jax.random.randint(k3, (B, T), 0, V)
    # the edges of the vocabulary: id 0 (what padded positions usually hold) and V - 1 (in the ragged last tile)
    tgt = tgt.at[0, -3:].set(0).at[-1, :2].set(V - 1)
    return h, w, tgt


def _cotangents(tgt):
    return jax.random.normal(jax.random.key(7), (2, *tgt.shape))


def _value_and_grads(fn, h, w, tgt):
    cot_l, cot_e = _cotangents(tgt)

    def objective(h, w):
        logp, ent = fn(h, w, tgt)
        return jnp.sum(logp * cot_l) + jnp.sum(ent * cot_e), (logp, ent)

    (_, (logp, ent)), (gh, gw) = jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))(h, w)
    return [np.asarray(x, np.float32) for x in (logp, ent, gh, gw)]


@pytest.mark.parametrize(
    "B, T, D, V, dtype, temperature, blocks",
    [
        (2, 13, 24, 70, jnp.float32, 0.7, SMALL),  # every dimension ragged against 16-wide tiles
        (3, 7, 40, 45, jnp.bfloat16, 1.0, SMALL),  # bf16 inputs, float32 head math
        (2, 16, 32, 256, jnp.float32, 1.0, dict(block_rows=16, block_vocab=64, block_d=16)),  # exact multiples
    ],
)
def test_kernel_equals_reference_values_and_grads(B, T, D, V, dtype, temperature, blocks, pallas_interpret):
    h, w, tgt = _inputs(B, T, D, V, dtype)
    got = _value_and_grads(
        lambda h, w, t: kernel_logprobs(h, w, t, temperature=temperature, interpret=pallas_interpret, **blocks),
        h, w, tgt)
    chunked = _value_and_grads(lambda h, w, t: token_logprobs(h, w, t, chunk=8, temperature=temperature), h, w, tgt)
    naive = _value_and_grads(lambda h, w, t: token_logprobs_naive(h, w, t, temperature=temperature), h, w, tgt)
    # each of the three within float32's bound of the float64 values and gradients (tests/tolerances.py: float32
    # head math on inputs that float32 holds exactly); bf16 inputs get bf16 gradients, rounded once more
    ref = head_reference(h, w, tgt, temperature, *_cotangents(tgt))
    out_rounding = ops(1, dtype) if dtype != jnp.float32 else 0.0
    for impl, res in (("kernel", got), ("chunked", chunked), ("naive", naive)):
        for name, a, key in zip(("logp", "entropy", "dh", "dw"), res, ("logp", "ent", "gh", "gw")):
            b = ref[key].reshape(a.shape)
            bound = ref[f"{key}_err"].reshape(a.shape) + out_rounding * np.abs(b) * (key in ("gh", "gw"))
            excess = np.abs(a - b) - bound
            assert np.all(excess <= 0), (impl, name, float(excess.max()))
    logp, ent = kernel_logprobs(h, w, tgt, interpret=pallas_interpret, **blocks)
    assert logp.dtype == ent.dtype == jnp.float32 and logp.shape == ent.shape == (B, T)
    # log-probs <= 0 and entropies >= 0, up to their rounding
    assert np.all(np.asarray(logp) <= ref["logp_err"]) and np.all(np.asarray(ent) >= -ref["ent_err"])


def test_matches_float64_definition(pallas_interpret):
    h, w, tgt = _inputs(2, 5, 20, 37, jnp.float32)
    logp, ent = kernel_logprobs(h, w, tgt, temperature=0.5, interpret=pallas_interpret, **SMALL)
    ref = head_reference(h, w, tgt, 0.5)  # float64, with float32's bounds (tests/tolerances.py)
    assert np.all(np.abs(np.asarray(logp, np.float64) - ref["logp"]) <= ref["logp_err"])
    assert np.all(np.abs(np.asarray(ent, np.float64) - ref["ent"]) <= ref["ent_err"])


def _largest_array(fn, *args) -> int:
    """Element count of the largest tensor type in the lowered StableHLO of ``fn``."""
    text = jax.jit(fn).lower(*args).as_text()
    dims = re.findall(r"tensor<((?:\d+x)+)[a-z]", text)
    return max(int(np.prod([int(d) for d in s.rstrip("x").split("x")])) for s in dims)


def test_no_logits_sized_array_in_forward_or_backward(pallas_interpret):
    B, T, D, V = 2, 40, 16, 1000
    h, w, tgt = _inputs(B, T, D, V, jnp.float32)

    def loss(fn):
        return jax.grad(lambda h, w: sum(x.sum() for x in fn(h, w, tgt)), argnums=(0, 1))

    kernel = _largest_array(loss(lambda h, w, t: kernel_logprobs(h, w, t, interpret=pallas_interpret)), h, w)
    naive = _largest_array(loss(token_logprobs_naive), h, w)
    assert naive >= B * T * V  # the check sees the logits when they are there
    assert kernel <= D * 1024 < B * T * V / 2, kernel  # the largest is the head weight (V padded to 1024)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_kernel_lowers_to_triton_for_a_cuda_gpu(monkeypatch, dtype):
    """Value and gradient of the compiled (not interpreted) kernel lower to the Triton dialect for CUDA on any
    machine, so a construct the Triton lowering refuses fails here, not first on a GPU (a ref view of a ref
    view, ``ref.at[...][...]``, did: "No support for multiple indexers")."""
    import scalerl_jax.kernels.token_logprobs as K

    monkeypatch.setattr(K, "resolve_interpret", lambda interpret: False)  # compile, whatever this backend is
    h, w, tgt = _inputs(2, 13, 24, 70, dtype)  # ragged rows, D and vocabulary: the padded path

    def objective(h, w):
        logp, ent = K.token_logprobs(h, w, tgt, **SMALL)
        return logp.sum() + ent.sum()

    lowered = jax.jit(jax.grad(objective, argnums=(0, 1))).trace(h, w).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    # the forward kernel and both backward kernels are Triton calls in the lowered program
    for name in ("token_logprobs_fwd", "token_logprobs_dh", "token_logprobs_dw"):
        assert name in text, name
    assert text.count("@__gpu$xla.gpu.triton(") == 3


def _rl_batch(cfg, B=4, T=12):
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, cfg.vocab_size, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    mask[:, 4:] = 1.0
    mask[-1, 9:] = 0.0  # right padding on one row
    return {
        "tokens": tokens, "loss_mask": mask, "gen_logp": (mask * rng.uniform(-4, -0.5, (B, T))).astype(np.float32),
        "staleness": np.zeros((B, T), np.int32), "advantages": rng.randn(B).astype(np.float32),
        "rewards": np.sign(rng.randn(B)).astype(np.float32), "group_ids": (np.arange(B) // 2).astype(np.int32),
        "truncated": np.zeros(B, np.float32),
    }


def test_train_step_with_pallas_kernel_equals_reference_step():
    ref_cfg = dataclasses.replace(tiny(), n_layers=2)  # V = 17: one padded 32-wide vocabulary tile
    ker_cfg = dataclasses.replace(ref_cfg, logprobs_impl="pallas")
    params = jax.tree.map(np.asarray, init_params(ref_cfg, jax.random.key(0), std=0.1))
    batch = _rl_batch(ref_cfg)
    # adam_eps=1 and no weight decay: the first update is -lr * g / (|g| + 1), a monotone map of each gradient
    # entry, so comparing the updates compares the gradients without Adam blowing up float32 noise in tiny ones
    opt = make_optimizer(TrainConfig(lr=LR, warmup_steps=0, weight_decay=0.0, adam_eps=1.0))
    out = {}
    for name, cfg in (("reference", ref_cfg), ("pallas", ker_cfg)):
        loss_fn = rl_loss(cfg, LossConfig(), temperature=0.8)
        state, m = jax.jit(make_train_step(loss_fn, opt))(init_train_state(params, opt), batch)
        deltas = jax.tree.map(lambda new, old: np.asarray(new) - old, state.params, params)
        out[name] = ([float(m[k]) for k in ("loss", "entropy", "grad_norm")], jax.tree.leaves(deltas))
    (m_r, d_r), d_k = out["reference"], out["pallas"][1]
    assert abs(m_r[0]) > 1e-3 and m_r[2] > 1e-3  # a loss and gradients worth comparing
    assert len(d_k) == len(d_r) > 10
    for b in d_r:
        assert np.abs(b).max() > 0  # every parameter moved (the head included)
    # two float32 orderings of one train step (tests/tolerances.py)
    check_train_steps(ref_cfg, params, batch, out["reference"], out["pallas"], lr=LR, temperature=0.8)


def test_unavailable_implementations_are_refused(monkeypatch):
    h, w, tgt = _inputs(1, 4, 16, 20, jnp.float32)
    with pytest.raises(ConfigError, match="logprobs_impl"):
        dataclasses.replace(tiny(), logprobs_impl="pallas", head_dtype="bfloat16")
    with pytest.raises(ConfigError, match="logprobs_impl"):
        dataclasses.replace(tiny(), logprobs_impl="triton")
    with pytest.raises(ValueError, match="logprobs_impl.*float32 only"):
        head_logprobs(h, w, tgt, impl="pallas", head_dtype="bfloat16")
    with pytest.raises(ValueError, match="logprobs_impl must be"):
        head_logprobs(h, w, tgt, impl="cuda")
    with pytest.raises(ValueError, match="power of two"):
        kernel_logprobs(h, w, tgt, interpret=True, block_vocab=24)
    # a backend with no compiled kernel (TPU): an error naming the field, not the reference in disguise
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with pytest.raises(ValueError, match="logprobs_impl='pallas' is unavailable.*'tpu'"):
        head_logprobs(h, w, tgt, impl="pallas")
    logp, _ = head_logprobs(h, w, tgt, impl="reference")  # the reference still runs there
    assert logp.shape == (1, 4)


def test_compiled_kernel_is_refused_on_cpu():
    """On a CPU backend the kernel cannot be compiled (only interpreted): asking for it compiled is an error, not a
    silent fallback. On a GPU it compiles, so there is nothing to refuse."""
    if jax.default_backend() != "cpu":
        pytest.skip(f"a CPU-only refusal; the backend here is {jax.default_backend()!r}, which compiles the kernel")
    h, w, tgt = _inputs(1, 4, 16, 20, jnp.float32)
    with pytest.raises(ValueError, match="cannot be compiled for the CPU"):
        kernel_logprobs(h, w, tgt, interpret=False)
