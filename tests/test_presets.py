"""Every preset x variant builds a valid configuration; every baseline / leave-one-out variant runs a few steps."""

import dataclasses
import json
import re

import jax
import numpy as np
import pytest
from scalerl_jax.experiments.presets import LOO_VARIANTS, PRESETS, VARIANTS, build_plan
from scalerl_jax.experiments.run_path import build_trainer

from scalerl_jax.config import ConfigError, LossConfig
from scalerl_jax.data.pipeline import build_prompt_data
from scalerl_jax.data.tokenizer import CharTokenizer
from scalerl_jax.models import init_params
from tests.conftest import ROOT, printed_json

R = dataclasses.replace


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_combination_is_a_valid_config(preset, variant):
    plan = build_plan(preset, variant, seed=3)
    exp = plan.exp
    assert exp.train.seed == 3 and plan.variant == variant
    rows = exp.rollout.prompts_per_batch * exp.rollout.group_size
    assert rows % exp.train.microbatches == 0
    if exp.rollout.length.kind == "interruption":
        lc = exp.rollout.length
        assert exp.rollout.max_new_tokens >= lc.think_budget_hi + 1 + lc.answer_budget - 1
    # what the variant promises to change, against the ScaleRL recipe of RECIPE.md
    base = build_plan(preset, "scalerl", seed=3).exp
    expect = {
        "ppo_off_policy": lambda e: e.rollout.mode == "ppo_off_policy",
        "dapo": lambda e: e.loss.kind == "dapo" and e.loss.eps_high == 0.26 and e.loss.aggregation == "prompt",
        "gspo": lambda e: e.loss.kind == "gspo" and (e.loss.eps_low, e.loss.eps_high) == (3e-3, 5e-3),
        "bf16_head": lambda e: e.model.head_dtype == "bfloat16",
        "sample_agg": lambda e: e.loss.aggregation == "sample",
        "token_agg": lambda e: e.loss.aggregation == "token",
        "prompt_norm": lambda e: e.loss.normalization == "prompt",
        "no_norm": lambda e: e.loss.normalization == "none",
        "no_zvf": lambda e: not e.loss.filter_zero_variance,
        "no_npr": lambda e: not e.data.npr,
        "length_penalty": lambda e: e.rollout.length.kind == "penalty",
        "deepseek_grpo": lambda e: (e.loss.kind, e.loss.aggregation, e.loss.normalization, e.loss.eps_high)
        == ("grpo", "sample", "prompt", 0.2),
        "qwen25_dapo": lambda e: (e.loss.kind == "dapo" and e.loss.eps_high == 0.28
                                  and e.rollout.mode == "ppo_off_policy"),
        "magistral": lambda e: e.loss.kind == "dapo" and e.rollout.mode == "pipeline",
        "minimax": lambda e: e.loss.kind == "cispo" and e.rollout.mode == "ppo_off_policy"
        and e.model.head_dtype == "float32" and e.loss.aggregation == "prompt",
        "scalerl": lambda e: (e.loss.kind, e.rollout.mode, e.model.head_dtype, e.loss.aggregation,
                              e.loss.normalization, e.loss.filter_zero_variance, e.data.npr, e.rollout.length.kind)
        == ("cispo", "pipeline", "float32", "prompt", "batch", True, True, "interruption"),
    }
    assert expect[variant](exp), variant
    if variant in LOO_VARIANTS:  # leave-one-out: exactly one component differs from ScaleRL
        diffs = [f for f in ("loss", "rollout", "data", "model") if getattr(exp, f) != getattr(base, f)]
        assert len(diffs) == 1, diffs


def _recipe_numbers() -> dict[str, float]:
    """The 8B recipe's numbers read from docs/RECIPE.md's own sentences (the spec, not the preset's source)."""
    text = " ".join((ROOT / "docs" / "RECIPE.md").read_text().split())
    patterns = {
        "lr": r"constant lr ([0-9.e-]+) after", "warmup": r"after (\d+) linear warm-up steps",
        "adam_eps": r"Adam eps ([0-9.e-]+)", "wd": r"weight decay ([0-9.]+)\.",
        "eps_max": r"our default is ([0-9.]+)\.", "k": r"k = 4 and 8 equal, (\d+) adopted",
        "think_lo": r"from \[(\d+)k, \d+k\] tokens", "think_hi": r"from \[\d+k, (\d+)k\] tokens",
        "answer": r"answer budget: (\d+)k tokens", "prompts": r"Batch: (\d+) prompts x",
        "group": r"prompts x (\d+) generations",
        "layers": r"Llama-3.1-8B shapes: (\d+) layers", "d_model": r"d_model (\d+)", "ffn": r"FFN (\d+)",
        "heads": r"(\d+) query heads", "kv": r"(\d+) KV heads", "vocab": r"vocab (\d+)",
    }
    out = {}
    for name, pat in patterns.items():
        m = re.search(pat, text)
        assert m, f"docs/RECIPE.md no longer says {pat!r}"
        out[name] = float(m.group(1))
    return out


def test_8b_preset_numbers_match_the_recipe():
    r = _recipe_numbers()
    e = build_plan("8b").exp
    assert (e.rollout.prompts_per_batch, e.rollout.group_size) == (r["prompts"], r["group"])
    assert (e.train.lr, e.train.warmup_steps, e.train.adam_eps, e.train.weight_decay) == (
        r["lr"], r["warmup"], r["adam_eps"], r["wd"])
    assert e.train.schedule == "constant" and e.loss.kind == "cispo"
    assert e.loss.eps_max == r["eps_max"] and e.rollout.k == r["k"] and e.rollout.mode == "pipeline"
    lc = e.rollout.length
    assert (lc.think_budget_lo, lc.think_budget_hi, lc.answer_budget) == (
        r["think_lo"] * 1024, r["think_hi"] * 1024, r["answer"] * 1024)
    m = e.model
    assert (m.n_layers, m.d_model, m.ffn_dim, m.n_heads, m.n_kv_heads, m.vocab_size) == (
        r["layers"], r["d_model"], r["ffn"], r["heads"], r["kv"], r["vocab"])
    # the 16,384-token row holds the prompt, the largest thinking budget, the interruption text and the answer
    plan = build_plan("8b")
    assert e.rollout.max_prompt_len + e.rollout.max_new_tokens <= plan.seq_len == 16384


def _informative_score(completions, problems):
    """Independent of the task: +1 iff the completion's length is even, so every group has variance."""
    r = np.array([1.0 if len(c) % 2 == 0 else -1.0 for c in completions], np.float32)
    return r, {"timeouts": 0, "no_answer": 0}


def variant_runs(out_dir: str) -> dict:
    """Run by tests/_variant_runs.py in the suite's background lane: every variant for 2 steps of a cut-down tiny
    model; per variant, the summary's step count and the rows of its metrics.jsonl."""
    data = build_prompt_data("arith", val_size=8, seed=0)
    res = {}
    for variant in sorted(VARIANTS):
        plan = build_plan("tiny", variant)
        exp = plan.exp
        small = R(exp.model, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64)
        exp = R(exp, model=small, out_dir=f"{out_dir}/{variant}",
                rollout=R(exp.rollout, prompts_per_batch=4, group_size=4, k=2),
                train=R(exp.train, steps=2, eval_every=100, eval_samples=1, checkpoint_every=100))
        plan = R(plan, exp=exp)
        params = init_params(small, jax.random.key(0), std=0.5)
        trainer = build_trainer(plan, params, data, tok=CharTokenizer(), score=_informative_score, log=lambda s: None)
        try:
            summary = trainer.run()
        finally:
            trainer.close()
        res[variant] = {"steps": summary["steps"],
                        "rows": [json.loads(line) for line in open(f"{out_dir}/{variant}/metrics.jsonl")]}
    return res


@pytest.mark.extended  # every leave-one-out variant's short run: a study's runs, one of CI's extended checks
@pytest.mark.background("variant_runs", ["tests/_variant_runs.py", "{out}"])
def test_every_variant_runs_a_few_steps(background):
    res = printed_json(background["variant_runs"])
    assert sorted(res) == sorted(VARIANTS)
    for variant, v in res.items():
        assert v["steps"] == 2, variant
        rows = v["rows"]
        train = [r for r in rows if r["kind"] == "train"]
        assert [r["step"] for r in train] == [1, 2], variant
        assert all(np.isfinite(r["loss"]) for r in train), variant
        assert sum(r["kind"] == "eval" for r in rows) == 2  # before RL and at the end


def test_loss_config_rejects_unknown_kind():
    with pytest.raises(ConfigError):
        LossConfig(kind="ppo")


@pytest.mark.parametrize("preset", ["tiny_moe", "smoke_moe", "scout"])
def test_moe_presets_are_the_recipe_on_the_moe_model(preset):
    from scalerl_jax.experiments.presets import MOE_PRESETS

    plan = build_plan(preset, "scalerl", seed=1)
    dense = build_plan({"tiny_moe": "tiny", "smoke_moe": "smoke", "scout": "8b"}[preset], "scalerl", seed=1)
    assert preset in MOE_PRESETS and plan.exp.model.arch == "llama4"
    # same recipe, only the model (and, for Scout, the expert-parallel mesh) differs
    for f in ("loss", "rollout", "data", "train"):
        assert getattr(plan.exp, f) == getattr(dense.exp, f), f
    if preset == "scout":
        m = plan.exp.model
        assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.n_experts, m.top_k, m.expert_ffn_dim,
                m.vocab_size) == (48, 5120, 40, 8, 16, 1, 8192, 202048)
        assert plan.exp.mesh.expert == 16 and plan.n_trainer_devices == 16 and plan.real
        assert 16.5e9 < m.num_active_params() < 17.5e9 and 1.05e11 < m.num_params() < 1.1e11


def test_1b_preset_is_one_gpu_with_real_math_budgets():
    """The cheapest real run: Llama-3.2-1B shapes, 1,024 prompt + 4,096 completion tokens, one trainer device with
    the embedded engine on it, interruption budget + the text's 48 tokens + answer within the completion."""
    plan = build_plan("1b")
    e = plan.exp
    assert plan.real and plan.n_trainer_devices == 1 and plan.base_kind == "none"  # needs --model and --data
    assert (e.model.n_layers, e.model.d_model, e.model.ffn_dim, e.model.vocab_size) == (16, 2048, 8192, 128256)
    assert e.model.tie_embeddings and 1.2e9 < e.model.num_params() < 1.3e9
    assert (e.rollout.max_prompt_len, e.rollout.max_new_tokens, plan.seq_len) == (1024, 4096, 5120)
    assert e.rollout.engine == "embedded" and e.rollout.local_servers == 0 and not e.rollout.sglang_urls
    lc = e.rollout.length
    assert lc.think_budget_hi + 48 + lc.answer_budget <= e.rollout.max_new_tokens
    assert (e.rollout.prompts_per_batch * e.rollout.group_size) % e.train.microbatches == 0


@pytest.mark.parametrize("preset,base,arch,devices", [("qwen25_1_5b", "1b", "qwen2", 1), ("qwen3_4b", "8b", "qwen3", 8),
                                                      ("qwen3_30b_a3b", "8b", "qwen3_moe", 8)])
def test_qwen_presets_are_their_base_recipe_on_the_published_shapes(preset, base, arch, devices):
    plan, ref = build_plan(preset, "scalerl", seed=1), build_plan(base, "scalerl", seed=1)
    assert plan.exp.model.arch == arch and plan.n_trainer_devices == devices
    for f in ("loss", "rollout", "data", "train"):
        assert getattr(plan.exp, f) == getattr(ref.exp, f), f
    # parameter counts of the published checkpoints (their model cards: 1.54B, 4.0B, 30.5B total / 3.3B active)
    m = plan.exp.model
    expect = {"qwen25_1_5b": (1.54, 1.54), "qwen3_4b": (4.02, 4.02), "qwen3_30b_a3b": (30.53, 3.35)}[preset]
    assert (round(m.num_params() / 1e9, 2), round(m.num_active_params() / 1e9, 2)) == expect
