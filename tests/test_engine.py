"""JaxEngine against independent references: HF transformers greedy generation, the trainer's log-prob
recomputation, and a hand-built mixed-version KV-cache reference for in-flight weight swaps."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.losses.logprobs import token_logprobs
from scalerl_jax.models import forward_hidden, head_weight, presets
from scalerl_jax.models.hf_io import save_hf_checkpoint
from scalerl_jax.rollout.engine import JaxEngine
from scalerl_jax.rollout.protocol import GenerationRequest, Generator, SamplingParams
from tests.engine_refs import PAD_T, mixed_cache_logp, np_params
from tests.hf_models import make_hf_llama
from tests.tolerances import max_logit, model_logprob_tol, model_rel


def test_greedy_matches_hf_generate(tmp_path):
    import torch

    hf = make_hf_llama(tmp_path, vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, init_std=1.0, seed=0)
    eng = JaxEngine.from_hf(tmp_path, max_batch=8, max_len=48, decode_chunk=4)
    assert isinstance(eng, Generator)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, size=n).tolist() for n in (1, 5, 9, 16)]
    n_new = 12
    sp = SamplingParams(temperature=0.0, max_new_tokens=n_new, stop_token_ids=(2,))
    outs = eng.generate([GenerationRequest(prompt_ids=p, params=sp, request_id=f"r{i}") for i, p in enumerate(prompts)])
    for i, (p, (c,)) in enumerate(zip(prompts, outs)):
        with torch.no_grad():
            g = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), do_sample=False,
                            max_new_tokens=n_new, eos_token_id=2, pad_token_id=0, output_logits=True,
                            return_dict_in_generate=True)
        ref = g.sequences[0, len(p):].tolist()
        # the comparison is only meaningful if greedy is not decided by a near-tie: the top two logits lie further
        # apart than two float32 orderings of the model can move them (tests/tolerances.py)
        logits = torch.stack(g.logits)[:, 0]
        top2 = logits.topk(2, dim=-1).values
        assert float((top2[:, 0] - top2[:, 1]).min()) > 2 * model_rel(eng.cfg, 48) * float(logits.abs().max())
        assert c.token_ids == ref, f"prompt {i}"
        assert c.request_id == f"r{i}"
        assert c.finish_reason == ("stop" if ref[-1] == 2 else "length")
        assert c.truncated == (ref[-1] != 2)


@pytest.fixture(scope="module")
def tiny():
    cfg = presets.tiny()
    return cfg, np_params(cfg, 0), np_params(cfg, 1)


@functools.partial(jax.jit, static_argnames=("cfg", "temperature"))
def _trainer_logprobs_padded(params, full_T, *, cfg, temperature):
    hidden = forward_hidden(params, full_T[None, :-1], cfg)
    return token_logprobs(hidden, head_weight(params, cfg), full_T[None, 1:], temperature=temperature)[0][0]


def _tol(params, cfg, prompt, completion, temperature):
    """The engine's sampled log-probs and the trainer's recomputation are two float32 orderings of the model
    (tests/tolerances.py)."""
    return model_logprob_tol(cfg, PAD_T, max_logit(params, cfg, list(prompt) + list(completion)) / temperature)


def _trainer_logprobs(params, cfg, prompt, completion, temperature):
    """What the trainer recomputes: full causal pass, FP32 head, logits / temperature."""
    full = np.zeros(PAD_T + 1, np.int32)
    full[: len(prompt) + len(completion)] = prompt + completion
    logp = _trainer_logprobs_padded(params, jnp.asarray(full), cfg=cfg, temperature=temperature)
    return np.asarray(logp[len(prompt) - 1: len(prompt) + len(completion) - 1])


def test_sampled_logprobs_equal_trainer_recomputation(tiny):
    cfg, params, _ = tiny
    eng = JaxEngine(cfg, params, max_batch=8, max_len=PAD_T, decode_chunk=4, seed=7, version=2)
    prompts = [[2, 3, 12, 4], [5, 13, 6, 6, 7, 14, 9]]
    reqs = [GenerationRequest(prompt_ids=p, params=SamplingParams(temperature=0.7, top_p=tp, max_new_tokens=20,
                                                                  stop_token_ids=(1,), n=3))
            for p, tp in zip(prompts, (1.0, 0.8))]
    outs = eng.generate(reqs)
    assert [len(o) for o in outs] == [3, 3]
    for p, comps in zip(prompts, outs):
        assert [c.sample_index for c in comps] == [0, 1, 2]
        for c in comps:
            assert c.prompt_ids == p and 1 <= len(c.token_ids) <= 20
            assert c.versions == [2] * len(c.token_ids) and not any(c.injected)
            ref = _trainer_logprobs(params, cfg, p, c.token_ids, 0.7)
            np.testing.assert_allclose(np.asarray(c.logprobs, np.float32), ref, rtol=0,
                                       atol=_tol(params, cfg, p, c.token_ids, 0.7))
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == 1 and 1 not in c.token_ids[:-1]
            else:
                assert c.finish_reason == "length" and c.truncated and len(c.token_ids) == 20


def test_weight_swap_mid_generation_keeps_old_cache(tiny):
    cfg, old, new = tiny
    C, swap_after, n_new, temp = 4, 2, 14, 0.8
    eng = JaxEngine(cfg, old, max_batch=8, max_len=PAD_T, decode_chunk=C, seed=3, version=3)
    eng.chunk_hook = lambda ci: eng.update_weights(new, 7) if ci == swap_after - 1 else None
    prompts = [[2, 3, 12, 4, 14], [9, 9, 13]]
    sp = SamplingParams(temperature=temp, top_p=0.95, max_new_tokens=n_new, n=2)
    outs = eng.generate([GenerationRequest(prompt_ids=p, params=sp) for p in prompts])
    assert eng.weight_version == 7
    m = swap_after * C  # tokens sampled under the old weights
    for p, comps in zip(prompts, outs):
        for c in comps:
            assert c.versions == [3] * m + [7] * (n_new - m)
            P, cut = len(p), len(p) - 1 + m  # positions < cut were fed through the old weights
            tokens = np.zeros(2 * PAD_T, np.int32)
            tokens[: P + n_new] = p + c.token_ids
            logp_old, logp_new = mixed_cache_logp(old, new, jnp.asarray(tokens), cut, temp, cfg=cfg, new_len=16)
            tok = np.asarray(c.token_ids)
            # completion token j is predicted at position P-1+j: by the old pass for j < m, else the new pass
            ref_old = np.asarray(logp_old)[np.arange(P - 1, cut), tok[:m]]
            ref_new = np.asarray(logp_new)[np.arange(n_new - m), tok[m:]]
            got = np.asarray(c.logprobs, np.float32)
            tol = max(_tol(w, cfg, p, c.token_ids, temp) for w in (old, new))
            np.testing.assert_allclose(got[:m], ref_old, atol=tol, rtol=0)
            np.testing.assert_allclose(got[m:], ref_new, atol=tol, rtol=0)
            # the mixed cache matters: recomputing everything with the new weights gives other log-probs, further
            # off than rounding could move them
            pure_new = _trainer_logprobs(new, cfg, p, c.token_ids, temp)[m:]
            assert np.abs(pure_new - got[m:]).max() > 2 * tol


def test_update_weights_from_checkpoint_path(tiny, tmp_path):
    cfg, old, new = tiny
    save_hf_checkpoint(new, cfg, tmp_path)
    eng = JaxEngine(cfg, old, max_batch=8, max_len=PAD_T, decode_chunk=4)
    eng.update_weights(str(tmp_path), 5)
    assert eng.weight_version == 5
    p = [3, 4, 12, 5]
    sp = SamplingParams(temperature=1.3, top_p=0.95, max_new_tokens=14)
    (c,), = eng.generate([GenerationRequest(prompt_ids=p, params=sp)])
    assert c.versions == [5] * 14
    np.testing.assert_allclose(c.logprobs, _trainer_logprobs(new, cfg, p, c.token_ids, 1.3), rtol=0,
                               atol=_tol(new, cfg, p, c.token_ids, 1.3))


def test_bad_requests_raise(tiny):
    cfg, params, _ = tiny
    eng = JaxEngine(cfg, params, max_batch=8, max_len=16)
    cases = [
        ([], SamplingParams(), "empty"),
        ([2, 17], SamplingParams(max_new_tokens=4), r"17 is outside the vocabulary \[0, 17\)"),
        ([2, -1], SamplingParams(max_new_tokens=4), "outside the vocabulary"),
        ([2] * 17, SamplingParams(max_new_tokens=0), "longer than the engine's max_len 16"),
        ([2] * 10, SamplingParams(max_new_tokens=8), "exceeds the engine's max_len"),
        ([2], SamplingParams(max_new_tokens=4, stop_token_ids=(99,)), "stop token id 99"),
    ]
    for prompt, sp, msg in cases:
        with pytest.raises(ValueError, match=msg):
            eng.generate([GenerationRequest(prompt_ids=[3], params=SamplingParams(max_new_tokens=2)),
                          GenerationRequest(prompt_ids=prompt, params=sp)])
    with pytest.raises(ValueError, match="shape"):
        eng.update_weights(np_params(dataclasses.replace(cfg, d_model=64), 0), 1)
