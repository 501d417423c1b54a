"""The dry run compiles what was asked: ``experiments.math_8b --dry-run`` hands the resolved ExperimentConfig (variant,
``--set`` overrides) to ``scalerl_jax.aot``, so a different loss, head dtype, model shape or micro-batch count
compiles a different program. (Before, only the model preset's name was forwarded and every variant compiled the
default CISPO / FP32-head step of the 8B model, even for ``--preset tiny``.) The three dry runs run in the suite's
background lane (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from scalerl_jax.experiments.presets import build_plan

from scalerl_jax.config import ConfigError, ExperimentConfig, from_dict
from scalerl_jax.models import tiny


def _dry_run_cmd(*args: str) -> list[str]:
    return ["-m", "experiments.math_8b", "--preset", "tiny", "--dry-run", "--out", "{out}", *args]


def _dry_run(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| fits |" in r.stdout, r.stdout
    (rep,) = json.loads((_out(r) / "dry_run" / "aot.json").read_text())
    return rep


def _out(r: subprocess.CompletedProcess) -> Path:
    return Path(r.args[r.args.index("--out") + 1])


# One block of the tiny Llama (D 128, 4 heads, 2 KV heads, head_dim 32, FFN 512), counted by hand: q and o are
# 128 x 128, k and v 128 x 64, the gated MLP 3 x 128 x 512, two RMSNorm scales of 128.
TINY_LAYER_PARAMS = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 512 + 2 * 128  # 246,016


@pytest.mark.slow
@pytest.mark.background("dry_run_tiny", _dry_run_cmd())
@pytest.mark.background("dry_run_tiny_bf16_head", _dry_run_cmd("--variant", "bf16_head"))
@pytest.mark.background("dry_run_tiny_gspo", _dry_run_cmd("--variant", "gspo", "--set", "model.n_layers=2",
                                                          "--set", "train.microbatches=2"))
def test_variants_and_overrides_reach_the_compiled_step(background):
    base = _dry_run(background["dry_run_tiny"])
    bf16 = _dry_run(background["dry_run_tiny_bf16_head"])
    gspo = _dry_run(background["dry_run_tiny_gspo"])
    # what each run asked for is what was compiled
    assert (base["loss"]["kind"], base["head_dtype"], base["microbatches"]) == ("cispo", "float32", 1)
    assert (bf16["loss"]["kind"], bf16["head_dtype"]) == ("cispo", "bfloat16")
    assert (gspo["loss"]["kind"], gspo["microbatches"]) == ("gspo", 2)
    assert (gspo["loss"]["eps_low"], gspo["loss"]["eps_high"]) == (3e-3, 5e-3)  # RECIPE.md's GSPO clip
    # the tiny model itself (not the 8B preset's), and the n_layers override: two blocks fewer, by hand
    assert tiny().n_layers == 4 and base["n_params"] < 2e6
    assert base["n_params"] - gspo["n_params"] == 2 * TINY_LAYER_PARAMS
    # three different programs
    assert len({base["hlo_sha256"], bf16["hlo_sha256"], gspo["hlo_sha256"]}) == 3
    # the config the compiler read is the run's own, written beside the report
    cfg = json.loads((_out(background["dry_run_tiny_gspo"]) / "dry_run" / "config.json").read_text())
    assert cfg["loss"]["kind"] == "gspo" and cfg["model"]["n_layers"] == 2


@pytest.mark.parametrize("preset", ["tiny", "small", "8b"])
def test_config_survives_json(preset):
    """What the dry run hands over: asdict -> JSON -> from_dict gives back an equal config (tuples, nested
    dataclasses, None fields); an unknown field or a bad value is named."""
    exp = build_plan(preset).exp
    back = from_dict(ExperimentConfig, json.loads(json.dumps(dataclasses.asdict(exp))))
    assert back == exp
    d = dataclasses.asdict(exp)
    d["loss"]["kindd"] = "gspo"
    with pytest.raises(ConfigError, match="LossConfig has no field.*'kindd'"):
        from_dict(ExperimentConfig, d)
