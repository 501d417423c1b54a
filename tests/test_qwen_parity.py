"""Parity of our Qwen2 / Qwen3 (dense decoder) and Qwen3-MoE (MoE decoder) with HF transformers' own classes on
random tiny configs, their checkpoint round trips, and the refusal of architectures we do not run.

Tolerance: the comparisons are float32 against float32, so they differ only by summation order. The logits are
held to 1e-4 absolute (the bound this parity is specified with); each test first checks that 1e-4 covers what
reordering can change on its configs: tests/tolerances.py's model_rel (8 standard deviations of a random walk over
the ~1,200-2,300 roundings on one logit's path, unit roundoff 2^-24: 4.5e-5 to 7.7e-5 relative) times the largest
logit (0.55-1.35 here) is 2e-5 to 5e-5, under 1e-4. Log-probs and the aux loss are held to their own derived bounds.
A wrong bias, norm, RoPE layout or routing weight moves logits by 1e-2 or more.
"""

import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from scalerl_jax.models import (
    CheckpointError,
    forward,
    forward_hidden,
    head_weight,
    load_hf_checkpoint,
    save_hf_checkpoint,
)
from scalerl_jax.models.moe import load_balancing_loss
from tests.conftest import HANG_S
from tests.hf_models import make_hf_qwen, torch_logits
from tests.tolerances import model_logprob_tol, model_rel, reorder_rel, unit_roundoff

LOGITS_ATOL = 1e-4  # the parity's specified bound on logits (module docstring)


def _check_atol_covers_reordering(cfg, ref) -> None:
    """The specified LOGITS_ATOL is at least what two float32 orderings of this model can differ by on ``ref``'s
    logits (tests/tolerances.py), so the comparison fails on a bug, not on a reduction order."""
    bound = model_rel(cfg, ref.shape[-2]) * float(np.abs(ref).max())
    assert bound <= LOGITS_ATOL, (bound, LOGITS_ATOL)

CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
CASES = [
    ("qwen2", dict(tied=False)),  # q/k/v biases, untied head
    ("qwen2", dict(tied=True, heads=8, kv_heads=2, theta=10000.0)),  # tied, GQA 4:1, another theta
    ("qwen3", dict(tied=True, head_dim=32)),  # q/k norms, head_dim 32 != 64 / 4, tied
    ("qwen3", dict(tied=False, heads=8, kv_heads=1, layers=3)),  # MQA, untied
    ("qwen3_moe", dict(experts=8, top_k=2)),  # every layer sparse, renormalised top-2
    ("qwen3_moe", dict(layers=4, sparse_step=2, mlp_only=(3,), norm_topk=False, top_k=3, head_dim=24)),
]


def _ours(params, tokens, cfg, **kw):
    cfg = dataclasses.replace(cfg, dtype="float32", **kw)
    return np.asarray(forward(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens), cfg))


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("arch,kw", CASES)
def test_logits_and_logprobs_match_transformers(tmp_path, arch, kw):
    import torch

    model = make_hf_qwen(tmp_path, arch, **kw)
    params, cfg = load_hf_checkpoint(tmp_path)
    assert cfg.arch == arch and cfg.tie_embeddings == kw.get("tied", False)
    assert cfg.head_dim == kw.get("head_dim", 64 // kw.get("heads", 4))
    tokens = np.random.RandomState(1).randint(0, 97, (2, 21))
    ref = torch_logits(model, tokens)
    _check_atol_covers_reordering(cfg, ref)
    np.testing.assert_allclose(_ours(params, tokens, cfg), ref, atol=LOGITS_ATOL, rtol=0)
    np.testing.assert_allclose(_ours(params, tokens, cfg, attn_chunk=8), ref, atol=LOGITS_ATOL, rtol=0)  # flash path
    if arch == "qwen3_moe":
        np.testing.assert_allclose(_ours(params, tokens, cfg, moe_impl="dense"), ref, atol=LOGITS_ATOL, rtol=0)
    # token log-probs through the training path (chunked FP32 head) against torch's log_softmax
    from scalerl_jax.losses.logprobs import token_logprobs

    c32 = dataclasses.replace(cfg, dtype="float32")
    p = jax.tree.map(jnp.asarray, params)
    h = forward_hidden(p, jnp.asarray(tokens[:, :-1]), c32)
    logp, _ = token_logprobs(h, head_weight(p, c32), jnp.asarray(tokens[:, 1:]), chunk=8)
    with torch.no_grad():
        ref_lp = torch.log_softmax(model(torch.tensor(tokens[:, :-1])).logits, -1)
    ref_lp = np.take_along_axis(ref_lp.numpy(), tokens[:, 1:, None], -1)[..., 0]
    # a log-prob is a logit minus its row's log-sum-exp: twice the logits' bound plus the log-sum-exp's own
    # reordering (tests/tolerances.py's model_logprob_tol)
    lp_tol = model_logprob_tol(cfg, tokens.shape[1], float(np.abs(ref).max()))
    np.testing.assert_allclose(np.asarray(logp), ref_lp, atol=lp_tol, rtol=0)
    assert np.abs(_log_softmax(ref) - _log_softmax(_ours(params, tokens, cfg))).max() <= lp_tol


def test_qwen3_moe_router_is_not_uniform_and_aux_loss_matches_transformers(tmp_path):
    """The router sends tokens to most experts with unequal weights (a degenerate router would hide dispatch and
    weighting bugs), and the load-balancing loss equals transformers' ``load_balancing_loss_func``."""
    import torch
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model = make_hf_qwen(tmp_path, "qwen3_moe", layers=3, mlp_only=(1,), experts=8, top_k=2)
    params, cfg = load_hf_checkpoint(tmp_path)
    assert [cfg.is_moe_layer(i) for i in range(3)] == [True, False, True]
    tokens = np.random.RandomState(3).randint(0, 97, (2, 21))
    _, stats = forward_hidden(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens),
                              dataclasses.replace(cfg, dtype="float32"), return_aux=True)
    load = np.asarray(stats["load"])
    assert load.shape == (2, 8) and (load > 0).sum(-1).min() >= 6 and load.max() > 2 / 8
    with torch.no_grad():
        out = model(torch.tensor(tokens), output_router_logits=True)
    ref = float(load_balancing_loss_func(out.router_logits, 8, 2))
    ours = float(load_balancing_loss(stats["load"], stats["prob"], cfg.top_k))
    # the router's probabilities lie at most model_rel of the model's path from their float64 values in either
    # ordering (tests/tolerances.py); the loss sums products of them over 42 tokens x 8 experts x 2 layers
    assert abs(ours - ref) <= (model_rel(cfg, tokens.shape[1]) + reorder_rel(2 * 21 * 8 * 2)) * ref, (ours, ref)


@pytest.mark.parametrize("arch,kw", [CASES[0], CASES[2], CASES[5]])
def test_save_load_round_trip_is_bitwise_and_transformers_loads_the_same_architecture(tmp_path, arch, kw):
    import transformers

    make_hf_qwen(tmp_path / "src", arch, **kw)
    params, cfg = load_hf_checkpoint(tmp_path / "src")
    save_hf_checkpoint(params, cfg, tmp_path / "out")
    params2, cfg2 = load_hf_checkpoint(tmp_path / "out")
    assert cfg2 == cfg
    chex.assert_trees_all_equal(params, params2, strict=True)
    src, out = load_file(tmp_path / "src" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert set(src) == set(out)  # transformers writes the per-expert layout we write
    for name in src:
        assert np.array_equal(src[name], out[name]), name
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == [CLASSES[arch]] and written["model_type"] == arch
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(reloaded).__name__ == CLASSES[arch]
    tokens = np.random.RandomState(2).randint(0, 97, (2, 13))
    ref = torch_logits(reloaded, tokens)
    _check_atol_covers_reordering(cfg, ref)
    np.testing.assert_allclose(ref, _ours(params, tokens, cfg), atol=LOGITS_ATOL, rtol=0)


def test_bf16_files_load_into_float32_params(tmp_path):
    make_hf_qwen(tmp_path / "src", "qwen3", tied=True)
    params, cfg = load_hf_checkpoint(tmp_path / "src")
    save_hf_checkpoint(params, cfg, tmp_path / "bf16", dtype="bfloat16")
    p16, cfg16 = load_hf_checkpoint(tmp_path / "bf16")
    assert cfg16.arch == "qwen3" and p16["layers"]["q_norm"].dtype == np.float32
    # bf16 keeps 8 significant bits: each weight rounds to within bfloat16's unit roundoff (2^-8) of its float32
    # value, relatively
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(p16)):
        np.testing.assert_allclose(b, a, rtol=unit_roundoff("bfloat16"), atol=0)


@pytest.mark.parametrize("field,value", [("architectures", ["MistralForCausalLM"]),
                                         ("architectures", ["Qwen2MoeForCausalLM"])])
def test_unsupported_architecture_is_refused_before_any_tensor_is_read(tmp_path, field, value):
    make_hf_qwen(tmp_path, "qwen3")
    hf = json.loads((tmp_path / "config.json").read_text())
    hf[field] = value
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")  # never opened
    with pytest.raises(CheckpointError) as e:
        load_hf_checkpoint(tmp_path)
    msg = str(e.value)
    assert "'architectures'" in msg and "config.json" in msg and str(value) in msg
    for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                 "Llama4ForCausalLM"):
        assert name in msg


def test_sliding_window_and_model_type_refusals_name_the_field(tmp_path):
    make_hf_qwen(tmp_path, "qwen2")
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(hf | {"use_sliding_window": True}))
    with pytest.raises(CheckpointError, match="'use_sliding_window'"):
        load_hf_checkpoint(tmp_path)
    del hf["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(hf | {"model_type": "mistral"}))
    with pytest.raises(CheckpointError, match="'model_type'.*'qwen3_moe'.*'mistral'"):
        load_hf_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(hf))  # model_type qwen2, no architectures: accepted
    assert load_hf_checkpoint(tmp_path)[1].arch == "qwen2"


def test_per_shard_load_equals_whole_load_on_four_devices(tmp_path):
    """Qwen2 (biases), Qwen3 (q/k norms) and Qwen3-MoE (per-expert tensors) read per shard on 4 simulated devices
    (FSDP, FSDP x tensor, FSDP x expert): bit for bit the whole load, each block read once; and Qwen3-MoE's
    expert-parallel dispatch equals the dense one."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    # as a module from the repository root, so that the script finds tests.hf_models with no PYTHONPATH
    r = subprocess.run([sys.executable, "-m", "tests._qwen_sharded_check", str(tmp_path)], cwd=root,
                       capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # expert-parallel Qwen3-MoE (output-weighted experts) = the dense dispatch: float32 sums in another order, held
    # to what that can change (the script's ep_tol, tests/tolerances.py's moe_layer_rel)
    ep, tol = out.pop("ep"), out.pop("ep_tol")
    assert ep["out"] <= tol["out"] and ep["grad"] <= tol["grad"], (ep, tol)
    assert len(out) == 7
    for case, res in out.items():
        assert res["equal"] and res["bytes_read"] == res["bytes_on_disk"], (case, res)


def test_padding_ids_past_the_tokenizer_decode_to_no_text(tmp_path):
    """Qwen checkpoints pad the vocabulary past the tokenizer's ids; a sampled padding id decodes to nothing (as
    transformers' tokenizers decode it) once the run sets the model's vocab_size, and stays an error past it."""
    import transformers

    from scalerl_jax.data.tokenizer import HFTokenizer, TokenizerError
    from tests.hf_models import make_qwen_tokenizer

    n = make_qwen_tokenizer(tmp_path, ["What is 1 + 2 * 3? <think> </think> \\boxed{7}"] * 20)
    tok = HFTokenizer(str(tmp_path))
    ids = tok.encode("What is 7")
    with pytest.raises(TokenizerError, match=f"outside \\[0, {n}\\)"):
        tok.decode(ids + [n + 3])
    tok.model_vocab_size = n + 7
    ref = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert tok.decode(ids[:2] + [n + 3] + ids[2:]) == ref.decode(ids[:2] + [n + 3] + ids[2:]) == "What is 7"
    with pytest.raises(TokenizerError, match=f"outside \\[0, {n + 7}\\)"):
        tok.decode(ids + [n + 7])


@pytest.mark.parametrize("vars_", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
@pytest.mark.parametrize("gen", [True, False])
def test_qwen_chat_template_renders_as_transformers_renders_it(tmp_path, vars_, gen):
    """Qwen3's ``enable_thinking`` and ``add_generation_prompt`` reach the template exactly as transformers passes
    them: our text equals ``PreTrainedTokenizerFast.apply_chat_template``'s, and so do the token ids."""
    import transformers

    from scalerl_jax.data.tokenizer import HFTokenizer
    from tests.hf_models import make_qwen_tokenizer

    make_qwen_tokenizer(tmp_path, ["What is 1 + 2 * 3? <think> </think> \\boxed{7}"] * 20)
    tok = HFTokenizer(str(tmp_path))
    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 2 * 3?"}]
    ours = tok.apply_chat_template(msgs, add_generation_prompt=gen, **vars_)
    theirs = ref.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False, **vars_)
    assert ours == theirs
    assert ours.endswith("<think>\n\n</think>\n\n") == (gen and vars_.get("enable_thinking") is False)
    assert tok.encode(ours) == ref(theirs, add_special_tokens=False)["input_ids"]


def test_enable_thinking_reaches_the_prompts_and_needs_the_chat_template(tmp_path):
    from scalerl_jax.experiments.presets import build_plan
    from scalerl_jax.experiments.run_path import load_prompts

    from scalerl_jax.config import ConfigError, DataConfig
    from scalerl_jax.data.tokenizer import HFTokenizer
    from tests.hf_models import make_qwen_tokenizer

    with pytest.raises(ConfigError, match="data.enable_thinking.*data.chat_template=true"):
        DataConfig(enable_thinking=False)
    make_qwen_tokenizer(tmp_path, ["What is 1 + 2 * 3? <think> </think> \\boxed{7}"] * 20)
    tok = HFTokenizer(str(tmp_path))
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(20)))
    plan = build_plan("small")
    exp = dataclasses.replace(plan.exp, data=dataclasses.replace(
        plan.exp.data, path=str(data), val_size=4, chat_template=True, enable_thinking=False),
        rollout=dataclasses.replace(plan.exp.rollout, max_prompt_len=256))
    prompts = load_prompts(exp, tok)
    text = prompts.train[0].prompt
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("arch,kw", [("qwen2", dict(tied=True)), ("qwen3", dict(head_dim=32)),
                                     ("qwen3_moe", dict(layers=3, mlp_only=(1,), experts=4, top_k=2))])
def test_embedded_engine_greedy_matches_transformers_generate(tmp_path, arch, kw):
    """The embedded engine (prefill + KV-cached decode, continuous batching of 4 prompts of different lengths) emits
    transformers' own greedy tokens. Weights of std 1 make the top-2 logit gaps wide enough that float32 summation
    order cannot flip a greedy choice (checked below against tests/tolerances.py's bound)."""
    import torch

    from scalerl_jax.rollout.engine import JaxEngine
    from scalerl_jax.rollout.protocol import GenerationRequest, SamplingParams

    hf = make_hf_qwen(tmp_path, arch, init_std=1.0, **kw)
    eng = JaxEngine.from_hf(tmp_path, max_batch=8, max_len=48, decode_chunk=4)
    assert eng.cfg.arch == arch
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 97, size=n).tolist() for n in (1, 5, 9, 16)]
    sp = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(2,))
    outs = eng.generate([GenerationRequest(prompt_ids=p, params=sp) for p in prompts])
    for i, (p, (c,)) in enumerate(zip(prompts, outs)):
        with torch.no_grad():
            g = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), do_sample=False,
                            max_new_tokens=12, eos_token_id=2, pad_token_id=0, output_logits=True,
                            return_dict_in_generate=True)
        # a greedy choice is decided only if its gap beats the two sides' float32 disagreement: each logit within
        # model_rel of the largest (tests/tolerances.py), so the top two's gap within twice that
        top2 = torch.stack(g.logits)[:, 0].topk(2, dim=-1).values
        gap = 2 * model_rel(eng.cfg, 48) * float(torch.stack(g.logits).abs().max())
        assert float((top2[:, 0] - top2[:, 1]).min()) > gap, gap
        assert c.token_ids == g.sequences[0, len(p):].tolist(), f"prompt {i}"


@pytest.mark.parametrize("arch,kw", [("qwen3", dict(head_dim=32)), ("qwen3_moe", dict(experts=4, top_k=2))])
def test_server_greedy_matches_transformers_generate_and_reports_the_architecture(tmp_path, arch, kw):
    """``python -m scalerl_jax.serve --model DIR`` over a random Qwen3 / Qwen3-MoE checkpoint: SGLang's
    ``/generate`` returns transformers' greedy tokens, and ``/get_model_info`` names the checkpoint's architecture."""
    import torch

    from tests.servers import kill, post, start_server, wait_healthy

    hf = make_hf_qwen(tmp_path / "ck", arch, init_std=1.0, **kw)
    cfg = load_hf_checkpoint(tmp_path / "ck")[1]
    proc, url = start_server(tmp_path, "--model", str(tmp_path / "ck"), "--max-len", "48")
    try:
        wait_healthy(url, proc)
        import httpx

        info = httpx.get(url + "/get_model_info", timeout=30).json()
        assert info["architectures"] == [CLASSES[arch]] and info["model_type"] == arch
        prompts = [np.random.default_rng(i).integers(3, 97, size=n).tolist() for i, n in enumerate((3, 11))]
        out = post(url, "/generate", {"input_ids": prompts,
                                      "sampling_params": {"temperature": 0, "max_new_tokens": 10}}).json()
        for p, o in zip(prompts, out):
            with torch.no_grad():
                g = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                do_sample=False, max_new_tokens=10, eos_token_id=2, pad_token_id=0,
                                output_logits=True, return_dict_in_generate=True)
            top2 = torch.stack(g.logits)[:, 0].topk(2, dim=-1).values
            gap = 2 * model_rel(cfg, 48) * float(torch.stack(g.logits).abs().max())  # as in the engine test above
            assert float((top2[:, 0] - top2[:, 1]).min()) > gap, gap
            assert o["output_ids"] == g.sequences[0, len(p):].tolist()
    finally:
        kill(proc)
