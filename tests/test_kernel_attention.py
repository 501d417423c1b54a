"""The attention dispatch (``ModelConfig.attention_impl``, scalerl_jax/kernels/attention.py) against the pure-JAX
reference.

On CPU: JAX's library Pallas flash attention (``mha``) and decode kernel (``decode_attention.mqa``) run in
interpret mode; the cuDNN wrapper's layout work (GQA, Llama-4 chunks folded into the batch, the ``lax.cond`` on a
traced per-layer flag) runs with ``implementation="xla"`` in place of cuDNN, which needs a GPU. Values and
gradients equal the reference on ragged sequence lengths (not multiples of the kernel blocks), float32 and
bfloat16 inputs, GQA, global and chunked local attention with a static or traced flag; the masks also equal a
float64 NumPy definition; the RL train step with ``attention_impl="pallas"`` equals the reference step; what
cannot run on the backend is refused with a message naming the field and the backend (the CPU-only refusals are
skipped, with the reason, on a GPU). The imports are only what the GPU check's offline image has (jax, numpy,
pytest and the project; ``benchmarks/offline_image_venv.sh``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scalerl_jax.experiments.numerics import model_from_checkpoint

from scalerl_jax.config import ConfigError, LossConfig, TrainConfig
from scalerl_jax.kernels.attention import check_impl, library_attention, pallas_attention, pallas_decode
from scalerl_jax.models import forward_cached, forward_hidden, init_cache, init_params, tiny, tiny_moe
from scalerl_jax.models.layers import attention, cached_attention
from scalerl_jax.train import init_train_state, make_optimizer, make_train_step
from scalerl_jax.train.rl import rl_loss
from tests.tolerances import (
    attention_rel,
    check_train_steps,
    max_logit,
    max_rel,
    model_logprob_tol,
    model_rel,
    own_error_tol,
)

#: the Pallas kernels run in interpret mode on a CPU: stand-ins for GPU-only code, seconds each, which the suite leaves
#: to CI's extended checks (scripts/test.sh --extended); benchmarks/gpu_check.sh runs every test here on a GPU
EXTENDED = pytest.mark.extended

BLOCKS = dict(block=16, block_bwd=16)
LR = 1e-2  # the train-step comparison's learning rate


def _qkv(B, T, H, K, Dh, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(k, (B, T, n, Dh), jnp.float32).astype(dtype) for k, n in zip(ks, (H, K, K))]


def _reference(q, k, v, local):
    B, T = q.shape[:2]
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    return attention(q, k, v, pos, pos, 8, local)  # chunk 8 < T: the reference's own flash path


def _value_and_grads(fn, q, k, v):
    cot = jax.random.normal(jax.random.key(9), q.shape, jnp.float32)

    def objective(q, k, v):
        o = fn(q, k, v)
        return jnp.sum(o.astype(jnp.float32) * cot), o

    (_, o), grads = jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return [np.asarray(x, np.float32) for x in (o, *grads)]


def _numpy_attention(q, k, v, local):
    """float64 definition: key s visible to query t iff s <= t and (local == 0 or s // local == t // local)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, H, Dh = q.shape
    G = H // k.shape[2]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(Dh)
    t, u = np.arange(T)[:, None], np.arange(T)[None, :]
    vis = (u <= t) & ((local == 0) | (u // max(local, 1) == t // max(local, 1)))
    s = np.where(vis, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhts,bshd->bthd", p / p.sum(-1, keepdims=True), v)


@pytest.fixture
def interp(pallas_interpret) -> bool:
    """Interpret the Pallas kernels on CPU, compile them on a GPU (SCALERL_PALLAS_INTERPRET, gpu_check.sh)."""
    return check_impl("pallas", interpret=pallas_interpret)


CASES = [  # B, T, H, K, Dh, dtype, local chunk, traced flag
    (2, 37, 4, 2, 24, jnp.float32, 10, False),  # ragged T (37 against 16-blocks), GQA, odd head dim, local chunks
    (1, 33, 4, 1, 16, jnp.float32, 0, False),  # multi-query, global
    (2, 29, 4, 2, 16, jnp.float32, 8, True),  # the chunk flag traced (Scout's layer scan), on
    (2, 40, 2, 2, 32, jnp.bfloat16, 16, False),  # bf16 inputs, MHA, local
]


@pytest.mark.parametrize("B, T, H, K, Dh, dtype, local, traced", CASES)
@pytest.mark.parametrize("impl", [pytest.param("pallas", marks=EXTENDED), "cudnn_layout"])
def test_kernel_equals_reference_values_and_grads(impl, B, T, H, K, Dh, dtype, local, traced, interp):
    q, k, v = _qkv(B, T, H, K, Dh, dtype)
    if impl == "pallas":
        def kernel(q, k, v, flag):
            return pallas_attention(q, k, v, flag, chunk=local or None, interpret=interp, **BLOCKS)
    else:
        def kernel(q, k, v, flag):
            return library_attention(q, k, v, flag, chunk=local or None, implementation="xla")
    flag = jnp.int32(local) if traced else local
    got = _value_and_grads(lambda q, k, v: kernel(q, k, v, flag), q, k, v)
    ref = _value_and_grads(lambda q, k, v: _reference(q, k, v, local), q, k, v)
    exact = _numpy_attention(q, k, v, local)
    # tests/tolerances.py: float32, two orderings of attention over at most T keys (relative to each tensor's
    # largest entry); bfloat16, where outputs and gradients are rounded to 8 bits, a few times the reference's own
    # error against the same attention in float32 on the same (exactly representable) inputs
    if dtype == jnp.float32:
        tols = [attention_rel(T, Dh, backward=name != "out") for name in ("out", "dq", "dk", "dv")]
        exact_tol = tols[0] / 2  # one float32 ordering against float64
    else:
        f32 = _value_and_grads(lambda q, k, v: _reference(q, k, v, local), *(x.astype(jnp.float32) for x in (q, k, v)))
        tols = [own_error_tol(b, c) for b, c in zip(ref, f32)]
        exact_tol = tols[0]
    for name, a, b, tol in zip(("out", "dq", "dk", "dv"), got, ref, tols):
        assert max_rel(a, b) <= tol, (name, max_rel(a, b), tol)
    assert max_rel(got[0], exact) <= exact_tol, (max_rel(got[0], exact), exact_tol)
    assert got[0].shape == (B, T, H, Dh)


def test_traced_flag_off_is_global_attention(interp):
    q, k, v = _qkv(2, 29, 4, 2, 16, jnp.float32, seed=3)
    ref = _numpy_attention(q, k, v, 0)
    off = jnp.int32(0)
    p = jax.jit(lambda q, k, v, f: pallas_attention(q, k, v, f, chunk=8, interpret=interp,
                                                    **BLOCKS))(q, k, v, off)
    x = jax.jit(lambda q, k, v, f: library_attention(q, k, v, f, chunk=8, implementation="xla"))(q, k, v, off)
    for o in (p, x):  # one float32 ordering against float64 (tests/tolerances.py)
        assert max_rel(o, ref) <= attention_rel(29, 16) / 2


def _cfg_cache(impl: str, S: int, dtype="float32"):
    cfg = dataclasses.replace(tiny_moe(), n_heads=4, n_kv_heads=2, head_dim=16, attention_impl=impl, dtype=dtype,
                              local_attn_chunk=16)
    return cfg, init_cache(cfg, batch=3, max_len=S)[1]  # one layer's cache


@EXTENDED
@pytest.mark.parametrize("S, local, dtype", [(300, 16, "float32"), (64, 0, "bfloat16")])
def test_pallas_decode_equals_reference_decode(S, local, dtype, interp):
    """One decode step over a filled cache: a ragged cache length (300: padded to 2 splits of 160 slots) and an
    even one, rows at different positions (first slot, a chunk edge, the last slot), local chunks on and off."""
    ref_cfg, cache = _cfg_cache("reference", S, dtype)
    ker_cfg = dataclasses.replace(ref_cfg, attention_impl="pallas")
    dt = jnp.float32 if dtype == "float32" else jnp.bfloat16
    ks = jax.random.split(jax.random.key(1), 5)
    cache = {n: jax.random.normal(kk, cache[n].shape, jnp.float32).astype(dt) for n, kk in zip("kv", ks[:2])}
    pos = jnp.array([[0], [16], [S - 1]], jnp.int32)
    q = jax.random.normal(ks[2], (3, 1, 4, 16), jnp.float32).astype(dt)
    k_new = jax.random.normal(ks[3], (3, 1, 2, 16), jnp.float32).astype(dt)
    v_new = jax.random.normal(ks[4], (3, 1, 2, 16), jnp.float32).astype(dt)
    outs = [cached_attention(q, k_new, v_new, pos, cache, cfg, local) for cfg in (ref_cfg, ker_cfg)]
    (o_ref, c_ref), (o_ker, c_ker) = outs
    # tests/tolerances.py: float32, two orderings of attention over S cache slots; bfloat16, a few times the
    # reference's own error against the same step in float32 (the same values, exactly representable)
    if dtype == "float32":
        tol = attention_rel(S, 16)
    else:
        f32_cfg, _ = _cfg_cache("reference", S, "float32")
        up = lambda x: x.astype(jnp.float32)  # noqa: E731
        o_f32, _ = cached_attention(up(q), up(k_new), up(v_new), pos, {n: up(c) for n, c in cache.items()}, f32_cfg,
                                    local)
        tol = own_error_tol(np.asarray(o_ref, np.float32), o_f32)
    assert max_rel(np.asarray(o_ker, np.float32), np.asarray(o_ref, np.float32)) <= tol
    for n in "kv":  # the same cache writes
        np.testing.assert_array_equal(np.asarray(c_ker[n], np.float32), np.asarray(c_ref[n], np.float32))
    if not local:
        return
    # a traced flag (what a layer scan over mixed layers would pass)
    o_tr = jax.jit(lambda f: pallas_decode(q.reshape(3, 2, 2, 16), c_ref["k"].astype(dt), c_ref["v"].astype(dt),
                                           pos[:, 0], f, chunk=16, interpret=interp))(jnp.int32(local))
    assert max_rel(np.asarray(o_tr, np.float32).reshape(o_ref.shape), np.asarray(o_ref, np.float32)) <= tol


@EXTENDED
def test_model_decode_with_pallas_equals_reference():
    """The model's KV-cached path (prefill on the reference, then T = 1 decode steps through the Pallas decode
    kernel) in a Llama-4 model with a chunked-local and a NoPE layer: hidden states equal the reference model's, and the
    decode steps cross a local-chunk boundary (positions 7, 8, 9 with 8-position chunks)."""
    ref_cfg = dataclasses.replace(tiny_moe(), n_layers=2, moe_every=1, nope_every=2, local_attn_chunk=8)
    ker_cfg = dataclasses.replace(ref_cfg, attention_impl="pallas")
    params = init_params(ref_cfg, jax.random.key(2), std=0.1)
    tokens = jax.random.randint(jax.random.key(3), (2, 10), 0, ref_cfg.vocab_size)
    outs = {}
    for name, cfg in (("reference", ref_cfg), ("pallas", ker_cfg)):
        step = jax.jit(lambda p, t, pos, c, cfg=cfg: forward_cached(p, t, pos, c, cfg))
        cache = init_cache(cfg, 2, 16)
        h, cache = step(params, tokens[:, :7], jnp.broadcast_to(jnp.arange(7), (2, 7)), cache)
        hs = [h]
        for t in range(7, 10):
            h, cache = step(params, tokens[:, t:t + 1], jnp.full((2, 1), t, jnp.int32), cache)
            hs.append(h)
        outs[name] = np.concatenate([np.asarray(x) for x in hs], axis=1)
        decode_jaxpr = str(jax.make_jaxpr(step)(params, tokens[:, :1], jnp.zeros((2, 1), jnp.int32), cache))
        assert ("pallas_call" in decode_jaxpr) == (name == "pallas")  # the kernel really ran, only where chosen
    # two float32 orderings of the model's forward pass over 10 positions (tests/tolerances.py)
    assert max_rel(outs["pallas"], outs["reference"]) <= model_rel(ref_cfg, 10)


def _rl_batch(cfg, B=2, T=24):
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, cfg.vocab_size, (B, T)).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    mask[:, 5:] = 1.0
    mask[-1, 20:] = 0.0  # right padding on one row
    return {
        "tokens": tokens, "loss_mask": mask, "gen_logp": (mask * rng.uniform(-4, -0.5, (B, T))).astype(np.float32),
        "staleness": np.zeros((B, T), np.int32), "advantages": np.array([1.0, -0.7], np.float32),
        "rewards": np.array([1.0, -1.0], np.float32), "group_ids": np.zeros(B, np.int32),
        "truncated": np.zeros(B, np.float32),
    }


@EXTENDED
def test_train_step_with_pallas_attention_equals_reference_step():
    """Llama-4 shapes with every layer MoE (one layer scan, the RoPE / NoPE choice and the chunk flag traced):
    layer 0 RoPE with 16-position local chunks, layer 1 NoPE and global; T = 24, ragged against the kernel's
    32-long blocks, and longer than the reference's 8-long attention chunk (its flash path)."""
    ref_cfg = dataclasses.replace(tiny_moe(), n_layers=2, moe_every=1, nope_every=2, local_attn_chunk=16,
                                  attn_chunk=8)
    ker_cfg = dataclasses.replace(ref_cfg, attention_impl="pallas")
    params = jax.tree.map(np.asarray, init_params(ref_cfg, jax.random.key(0), std=0.1))
    batch = _rl_batch(ref_cfg)
    # adam_eps=1, no weight decay: the update is a monotone map of each gradient entry (see the logprobs test)
    opt = make_optimizer(TrainConfig(lr=LR, warmup_steps=0, weight_decay=0.0, adam_eps=1.0))
    out = {}
    for name, cfg in (("reference", ref_cfg), ("pallas", ker_cfg)):
        step = make_train_step(rl_loss(cfg, LossConfig()), opt)
        assert ("pallas_call" in str(jax.make_jaxpr(step)(init_train_state(params, opt), batch))) == (name == "pallas")
        state, m = jax.jit(step)(init_train_state(params, opt), batch)
        deltas = jax.tree.map(lambda new, old: np.asarray(new) - old, state.params, params)
        out[name] = ([float(m[k]) for k in ("loss", "entropy", "grad_norm")], jax.tree.leaves(deltas))
    m_r = out["reference"][0]
    assert abs(m_r[0]) > 1e-3 and m_r[2] > 1e-3
    # two float32 orderings of one train step (tests/tolerances.py)
    check_train_steps(ref_cfg, params, batch, out["reference"], out["pallas"], lr=LR)


def test_unavailable_implementations_are_refused(monkeypatch):
    tokens = jnp.zeros((1, 8), jnp.int32)
    with pytest.raises(ConfigError, match="attention_impl"):
        dataclasses.replace(tiny(), attention_impl="flash")
    with pytest.raises(ConfigError, match="attention_impl='cudnn' takes bfloat16"):
        dataclasses.replace(tiny(), attention_impl="cudnn")  # tiny computes in float32
    cfg = dataclasses.replace(tiny(), attention_impl="cudnn", dtype="bfloat16")
    params = init_params(cfg, jax.random.key(0))
    with pytest.raises(ValueError, match="positions_BT need ModelConfig.attention_impl='reference'"):
        forward_hidden(params, tokens, dataclasses.replace(cfg, attention_impl="pallas"),
                       positions_BT=jnp.arange(8)[None] + 3)
    with pytest.raises(ValueError, match="power of two"):
        pallas_attention(*_qkv(1, 8, 2, 2, 16, jnp.float32), block=24)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with pytest.raises(ValueError, match=r"attention_impl='pallas' has no compiled kernel.*'tpu'"):
        check_impl("pallas")
    assert check_impl("reference") is None  # the reference runs everywhere


def test_gpu_kernels_are_refused_on_cpu():
    """On a CPU backend cuDNN attention and compiled (not interpreted) Pallas are refused, naming the field and the
    backend; on a GPU (the GPU check) both are available, so there is nothing to refuse."""
    if jax.default_backend() != "cpu":
        pytest.skip(f"CPU-only refusals; the backend here is {jax.default_backend()!r}, which runs these kernels")
    tokens = jnp.zeros((1, 8), jnp.int32)
    cfg = dataclasses.replace(tiny(), attention_impl="cudnn", dtype="bfloat16")
    params = init_params(cfg, jax.random.key(0))
    # cuDNN on CPU: refused when the forward pass is traced, naming the field and the backend
    with pytest.raises(ValueError, match=r"attention_impl='cudnn' needs a CUDA GPU.*'cpu'"):
        forward_hidden(params, tokens, cfg)
    with pytest.raises(ValueError, match=r"attention_impl='cudnn' needs a CUDA GPU.*'cpu'"):  # and in decoding
        cached_attention(*_qkv(1, 1, 4, 4, 32, jnp.bfloat16), jnp.zeros((1, 1), jnp.int32),
                         init_cache(cfg, 1, 16)[0], cfg)
    with pytest.raises(ValueError, match="cannot compile"):
        check_impl("pallas", interpret=False)


def test_kernels_lower_to_triton_for_a_cuda_gpu():
    """The compiled (not interpreted) attention kernels, forward and backward, and the decode kernel lower to the
    Triton dialect for CUDA on any machine: a construct the Triton lowering refuses fails here, not first on a GPU."""
    q, k, v = _qkv(2, 37, 4, 2, 24, jnp.float32)  # ragged T, GQA, local chunks: the padded path

    def objective(q, k, v):
        return pallas_attention(q, k, v, 10, interpret=False, **BLOCKS).sum()

    train = jax.jit(jax.grad(objective, argnums=(0, 1, 2))).trace(q, k, v).lower(lowering_platforms=("cuda",))
    assert train.as_text().count("@__gpu$xla.gpu.triton(") == 3  # forward, dK/dV, dQ

    qd, kd, vd = (jnp.zeros(s, jnp.bfloat16) for s in ((2, 2, 2, 32), (2, 2, 300, 32), (2, 2, 300, 32)))
    decode = jax.jit(lambda q, k, v, p: pallas_decode(q, k, v, p, 16, interpret=False)).trace(
        qd, kd, vd, jnp.array([5, 299])).lower(lowering_platforms=("cuda",))
    assert decode.as_text().count("@__gpu$xla.gpu.triton(") >= 1


def test_run_path_carries_the_kernel_choices():
    """A preset's attention and head-matmul implementations reach a model read from a checkpoint's config."""
    preset = dataclasses.replace(tiny(), attention_impl="pallas", head_matmul_impl="bf16x3")
    got = model_from_checkpoint(preset, tiny())
    assert (got.attention_impl, got.head_matmul_impl) == ("pallas", "bf16x3")


@EXTENDED
def test_embedded_engine_generates_through_the_pallas_decode_kernel(monkeypatch):
    """The engine the run path builds decodes through ``attention_impl`` (prefill keeps the reference): greedy
    generation with the Pallas decode kernel gives the reference engine's tokens and sampling log-probs, on a
    Llama-4 model whose local chunks (8 positions) the prompts and completions cross."""
    from scalerl_jax.rollout.engine import JaxEngine
    from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams

    ref_cfg = dataclasses.replace(tiny_moe(), n_layers=2, moe_every=1, nope_every=2, local_attn_chunk=8)
    params = jax.tree.map(np.asarray, init_params(ref_cfg, jax.random.key(3), std=0.5))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, ref_cfg.vocab_size, size=n).tolist() for n in (1, 6, 11)]
    sp = SamplingParams(temperature=0.0, max_new_tokens=12)
    import scalerl_jax.kernels.attention as ka

    traced = []  # the decode kernel is traced (once per compiled decode program) only when chosen
    monkeypatch.setattr(ka, "pallas_decode", lambda *a, **k: traced.append(1) or pallas_decode(*a, **k))
    outs = {}
    for impl in ("reference", "pallas"):
        cfg = dataclasses.replace(ref_cfg, attention_impl=impl)
        eng = JaxEngine(cfg, params, max_batch=4, max_len=32, decode_chunk=4)
        done = eng.generate([GenerationRequest(prompt_ids=p, params=sp, request_id=f"r{i}")
                             for i, p in enumerate(prompts)])
        outs[impl] = [c for (c,) in done]
        assert bool(traced) == (impl == "pallas")
    for r, k in zip(outs["reference"], outs["pallas"]):
        assert len(r.token_ids) == 12 and k.token_ids == r.token_ids
        # two float32 orderings of the model (tests/tolerances.py)
        tol = model_logprob_tol(ref_cfg, 32, max_logit(params, ref_cfg, prompts[0] + r.token_ids))
        np.testing.assert_allclose(k.logprobs, r.logprobs, atol=tol, rtol=0)
    assert len({tuple(c.token_ids) for c in outs["reference"]}) > 1  # distinct prompts, distinct outputs
