"""benchmarks/bench_archs.py: the two MoE layers it compares do the same expert matmul work per token (worked from
the shapes), and the benchmark runs end to end at small sizes and prints every row it promises."""

import subprocess
import sys
from pathlib import Path

import pytest
from scalerl_jax.benchmarks.bench_archs import moe_configs

ROOT = Path(__file__).resolve().parents[1]


def test_the_moe_layers_have_the_same_active_expert_width_as_the_floor():
    cfgs = moe_configs(d=128, ffn=256)
    l4, qw = cfgs["llama4 16e top-1 + shared"], cfgs["qwen3_moe 128e top-8"]
    assert (l4.arch, l4.n_experts, l4.top_k, l4.shared_expert) == ("llama4", 16, 1, True)
    assert (qw.arch, qw.n_experts, qw.top_k, qw.shared_expert) == ("qwen3_moe", 128, 8, False)
    # per token: Llama-4 runs one routed expert of width 256 and the shared one of width 256; Qwen3-MoE eight of 64;
    # the floor is one SwiGLU of width 2 x 256 = 512
    assert l4.top_k * l4.expert_ffn_dim + l4.expert_ffn_dim == 512
    assert qw.top_k * qw.expert_ffn_dim == 512


@pytest.mark.extended
def test_the_benchmark_runs_and_prints_its_ratios():
    out = subprocess.run(
        [sys.executable, "-m", "scalerl_jax.benchmarks.bench_archs", "--preset", "tiny", "--batch", "1", "--seq", "8",
         "--steps", "1", "--warmup", "0", "--tokens", "256", "--d", "32", "--ffn", "32", "--reps", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    for arch in ("llama |", "qwen2 |", "qwen3 |"):
        assert arch in text
    assert text.count("ragged, 1 device") == 2 and text.count("expert-parallel, 4 of 8 devices") == 2
    assert "ragged: Qwen3-MoE / Llama-4 time per token" in text
    assert "expert-parallel: Qwen3-MoE / Llama-4 time per token" in text
