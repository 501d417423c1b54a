"""The real run path on a Qwen base: ``python -m experiments.math_8b --preset small --model DIR --data FILE --steps 2``
on a random ``Qwen3ForCausalLM`` and a random ``Qwen3MoeForCausalLM`` made by transformers, with a tokenizer built
here carrying Qwen's special tokens (``<|im_end|>`` eos, ``<|endoftext|>`` pad, ``<think>`` / ``</think>``) and a
Qwen3-style chat template, and a model vocabulary padded past the tokenizer's (as Qwen's checkpoints are).

A random policy scores -1 on every sample, so every group has zero variance: ``loss.filter_zero_variance=false``
lets the two steps run (their advantages are 0) instead of waiting for a group with a spread."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from scalerl_jax.data.tokenizer import HFTokenizer
from scalerl_jax.models import load_hf_checkpoint
from tests.conftest import HANG_S, ROOT
from tests.hf_models import make_hf_qwen, make_qwen_tokenizer, torch_logits
from tests.tolerances import model_rel

CLASSES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def make_base(tmp_path, arch):
    """A jsonl of short arithmetic questions and an HF directory: a random ``arch`` model over a Qwen-style BPE."""
    rng = random.Random(0)
    rows = []
    for _ in range(400):
        a, b, c = rng.randint(1, 99), rng.randint(2, 9), rng.randint(2, 9)
        rows.append({"question": f"What is {a} + {b} * {c}?", "answer": str(a + b * c)})
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [f"{r['question']} {m} so the answer is \\boxed{{{r['answer']}}}" for r in rows
             for m in ("<think>", "</think>")]
    base = tmp_path / "base"
    n = make_qwen_tokenizer(base, texts)
    kw = dict(experts=4, top_k=2) if arch == "qwen3_moe" else dict(tied=True, head_dim=32)
    make_hf_qwen(base, arch, vocab=n + 7, **kw)  # 7 padding rows past the tokenizer's ids
    tok = HFTokenizer(str(base))
    cfg = json.loads((base / "config.json").read_text())
    cfg.update(eos_token_id=tok.token_to_id("<|im_end|>"), pad_token_id=tok.token_to_id("<|endoftext|>"),
               bos_token_id=None)
    (base / "config.json").write_text(json.dumps(cfg))
    (base / "generation_config.json").unlink()
    return base, data


@pytest.mark.extended
@pytest.mark.lane
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_small_preset_runs_on_a_qwen_base(tmp_path, arch):
    import transformers

    base, data = make_base(tmp_path, arch)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "experiments.math_8b", "--preset", "small", "--model", str(base),
                        "--data", str(data), "--steps", "2", "--out", str(out), "--no-fit",
                        "--set", "loss.filter_zero_variance=false"],
                       cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert f"{base}: {arch}" in r.stdout  # the architecture came from the checkpoint
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in rows if x["kind"] == "train"]
    assert [x["step"] for x in train] == [1, 2]
    assert all(x["reward_mean"] == -1.0 and x["n_groups"] > 0 for x in train)  # scored by math-verify
    assert [x["step"] for x in rows if x["kind"] == "eval"] == [0, 2]
    assert any((out / "checkpoints").iterdir())
    pushed = sorted((out / "weights").iterdir())[-1]  # the last push to the generators
    hf = json.loads((pushed / "config.json").read_text())
    assert hf["architectures"] == [CLASSES[arch]] and hf["model_type"] == arch
    model = transformers.AutoModelForCausalLM.from_pretrained(pushed, dtype="float32").eval()
    assert type(model).__name__ == CLASSES[arch]
    params, cfg = load_hf_checkpoint(pushed)
    assert cfg.arch == arch
    import dataclasses

    import jax
    import jax.numpy as jnp

    from scalerl_jax.models import forward

    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (1, 12))
    ours = np.asarray(forward(jax.tree.map(jnp.asarray, params), jnp.asarray(tokens),
                              dataclasses.replace(cfg, dtype="float32")))
    # the pushed files are the run's own dtype (float32 here): transformers reads the same numbers, and the two
    # forward passes are two float32 orderings of one model (tests/tolerances.py's model_rel of the largest logit)
    np.testing.assert_allclose(torch_logits(model, tokens), ours, atol=model_rel(cfg, 12) * float(np.abs(ours).max()),
                               rtol=0)


@pytest.mark.slow
@pytest.mark.background("dry_run_qwen25_1_5b", ["-m", "experiments.math_8b", "--preset", "qwen25_1_5b", "--dry-run",
                                                "--devices", "1", "--device-memory-gb", "80"])
@pytest.mark.background("dry_run_qwen3_4b", ["-m", "experiments.math_8b", "--preset", "qwen3_4b", "--dry-run",
                                             "--devices", "8", "--device-memory-gb", "80"])
def test_dry_runs_of_the_dense_qwen_presets_fit(background):
    for name, mesh, batch in (("dry_run_qwen25_1_5b", "1 |  |", "128x5120"),
                              ("dry_run_qwen3_4b", "fsdp8", "768x16384")):
        r = background[name]
        assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
        assert "| fits |" in r.stdout and mesh in r.stdout and batch in r.stdout, r.stdout[-2000:]
        assert "init peak" in r.stdout and "step peak" in r.stdout
