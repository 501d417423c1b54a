"""End to end: metrics.jsonl -> fit_runs / the CLI -> summary.json, report.md, figures; and bad run files."""

import json
import warnings

import numpy as np
import pytest

from scalerl_jax import fit as fit_cli
from scalerl_jax.scaling import ScalingFitWarning
from scalerl_jax.scaling.io import load_run
from scalerl_jax.scaling.report import fit_runs
from tests.tolerances import ops


def _write_run(path, A, B, C_mid, R0, seed, n=24, c_end=0.2):
    """A tiny run's eval rows in device-hours (val_n 128 prompts x val_k 4 samples), interleaved with train rows."""
    rng = np.random.default_rng(seed)
    c = np.linspace(0.0, c_end, n)
    mu = np.where(c > 0, R0 + (A - R0) / (1 + (C_mid / np.maximum(c, 1e-12)) ** B), R0)
    y = rng.binomial(4, rng.beta(mu[:, None] * 3, (1 - mu[:, None]) * 3, size=(n, 128))).mean(1) / 4
    path.mkdir(parents=True)
    with open(path / "metrics.jsonl", "w") as f:
        for i, (ci, yi) in enumerate(zip(c, y)):
            f.write(json.dumps({"kind": "train", "step": 10 * i, "loss": 0.1}) + "\n")
            f.write(json.dumps({"kind": "eval", "step": 10 * i, "device_hours": ci, "flops": ci * 1e15,
                                "val_reward": yi, "val_n": 128, "val_k": 4}) + "\n")
    return c, y


def test_fit_runs_two_tiny_runs(tmp_path):
    _write_run(tmp_path / "a", 0.8, 1.5, 0.04, 0.3, seed=1)
    _write_run(tmp_path / "b", 0.79, 1.5, 0.04, 0.3, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingFitWarning)
        fit_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "out", fit_until=0.5,
                     num_samples=300, num_chains=2, num_warmup=300)
    out = tmp_path / "out"
    for f in ["summary.json", "report.md", "fit_a.png", "fit_b.svg", "A_posteriors.png", "efficiency.svg",
              "table.png"]:
        assert (out / f).exists(), f
    on_disk = json.loads((out / "summary.json").read_text())
    a = on_disk["runs"]["a"]
    # half of the last eval's compute (linspace's exact endpoint 0.2), and that compute itself: a float64 product or
    # ratio of it at most, 2 roundings (tests/tolerances.py)
    assert a["n_fit"] == 12 and a["fit_until_compute"] == pytest.approx(0.1, rel=2 * ops(2, "float64"))
    assert a["target_compute"] == pytest.approx(0.2, rel=2 * ops(2, "float64"))  # the run continued: its last eval
    p = a["prediction"]
    assert p["lo"] <= p["mean"] <= p["hi"]
    true_end = 0.3 + 0.5 / (1 + (0.04 / 0.2) ** 1.5)
    assert p["lo"] - 0.02 <= true_end <= p["hi"] + 0.02
    assert a["bayes"]["likelihood"] == "counts" and "R0" in a["bayes"]["summary"]  # step-0 eval: R0 fitted
    # one eval's noise (128 prompts, per-prompt variance at most 1/16 from the Beta difficulty plus 1/16 from 4
    # samples: sd <= sqrt(0.125 / 128) = 0.031): 0.1 is 3 of those, for a prediction from half the curve
    assert abs(a["held_out"]["error_nearest_target"]) < 0.1
    # Nearly equal ceilings: the paper's rule compares B at a shared A when the posterior means are within 0.02.
    rule = on_disk["paper_rule"][0]
    assert rule["rule"] in ("A", "B at shared A")
    assert len(on_disk["pairwise"]) == 2
    # each a count over the draws (ties have probability 0), divided in float64: complements to float64's last bits
    assert on_disk["pairwise"][0]["P_A1_gt_A2"] == pytest.approx(1 - on_disk["pairwise"][1]["P_A1_gt_A2"],
                                                                 abs=ops(2, "float64"))
    report = (out / "report.md").read_text()
    assert "Predicted validation reward" in report and "prediction error" in report


def test_load_run_skips_bad_rows_and_dedups(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    rows = [{"kind": "eval", "device_hours": 0.0, "val_reward": 0.3},
            {"kind": "eval", "device_hours": 0.1, "val_reward": float("nan")},
            {"kind": "eval", "device_hours": 0.2, "val_reward": 0.4},
            {"kind": "eval", "device_hours": 0.2, "val_reward": 0.45},
            {"kind": "train", "device_hours": 0.3, "loss": 1.0}]
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"kind": "eval", "devi'
    (run / "metrics.jsonl").write_text(text)
    with pytest.warns(ScalingFitWarning):
        curve = load_run(run)
    assert curve.compute.tolist() == [0.0, 0.2] and curve.reward.tolist() == [0.3, 0.45]
    assert curve.val_n is None
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path / "missing")


def test_cli_help_and_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        fit_cli.main(["--help"])
    assert e.value.code == 0
    assert "--fit-until" in capsys.readouterr().out
    _write_run(tmp_path / "short", 0.8, 1.5, 0.04, 0.3, seed=1, n=6)
    assert fit_cli.main([str(tmp_path / "short"), "--out", str(tmp_path / "o")]) == 2
    assert "need at least 5" in capsys.readouterr().err
