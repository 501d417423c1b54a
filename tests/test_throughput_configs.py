"""benchmarks/throughput_configs.py: the grid it compiles and the fit it reports, on the tiny preset."""

import pytest
from scalerl_jax.benchmarks import throughput_configs as tc

from scalerl_jax.models.presets import tiny


def test_the_grid_covers_every_combination_and_refuses_a_ragged_size():
    grid = tc.configs([128, 256], 64, ["reference", "bf16x3"])
    assert len(grid) == 2 * 2 * 2
    assert {(c["tokens"], c["seqs"]) for c in grid} == {(128, 2), (256, 4)}
    with pytest.raises(ValueError, match="not a multiple of --seq-len 64"):
        tc.configs([100], 64, ["reference"])


def test_one_configuration_compiles_and_reports_its_peak_and_flops():
    r = tc.compile_one("tiny", 64, {"tokens": 128, "seqs": 2, "remat": True, "head_matmul_impl": "bf16x3"})
    # the tiny model's state is kilobytes: it fits either device, and its peaks are positive and below a megabyte x
    # the parameter count's few copies (params, two Adam moments, gradients)
    assert r["fits"] == {name: True for name in tc.DEVICES_GB}
    n = tiny().num_params()
    assert 0 < r["init_peak_gb"] and 0 < r["step_peak_gb"] < 1.0
    assert r["init_peak_gb"] * 1e9 >= 3 * 4 * n  # float32 params and both moments
    # 3 x the forward's FLOPs by hand from the tiny shapes (d 128, 4 layers, 4 / 2 heads of 32, FFN 512, vocab 17):
    # 2 x matmul weights (4 x (128 x 32 x 12 + 3 x 128 x 512) + 17 x 128 = 985,216) + causal attention
    # (4 layers x 2 x 4 heads x 32 x 64 keys = 65,536) = 2,035,968 per token, x 128 tokens x 3
    assert r["step_tflops"] == pytest.approx(3 * 128 * 2_035_968 / 1e12, rel=1e-12)
    assert "| 128 (2 x 64) | layer input only | bf16x3 |" in tc.table([r])
