"""benchmarks/calibration.py on a stored study (results/loo_small_head: 2 recipes x 3 seeds of the small preset): the
held-out evals it counts are those past half of each run's FLOPs, counted here from metrics.jsonl itself; one eval's
predictive interval holds at least what the mean curve's narrower band holds; every run of a 3-seed recipe is held
against the band of a new seed from its 2 other seeds' pooled fit; the markdown table has a row per run and the
pooled line."""

import json

import numpy as np
import pytest

from tests.conftest import ROOT

STUDY = ROOT / "results" / "loo_small_head"


@pytest.mark.extended  # six NUTS fits, two recipes' pooled fits and their bands: about two minutes
def test_the_calibration_study_of_a_stored_study():
    from scalerl_jax.benchmarks.calibration import markdown, run_study

    res = run_study([STUDY], num_samples=300)
    runs = sorted(p.parent for p in STUDY.glob("*/metrics.jsonl"))
    assert len(runs) == 6 and set(res["runs"]) == {f"{STUDY.name}/{r.name}" for r in runs}
    for r in runs:
        rows = [json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines() if line.strip()]
        flops = np.array([x["flops"] for x in rows if x.get("kind") == "eval"])
        row = res["runs"][f"{STUDY.name}/{r.name}"]
        assert row["n_held"] == int(np.sum(flops > 0.5 * flops.max()))
        assert row["n_fit"] + row["n_held"] == flops.size
        assert row["final"] == pytest.approx([x["val_reward"] for x in rows if x.get("kind") == "eval"][-1])
        assert isinstance(row["final_in_seed_band"], bool) and row["width_seed"] > 0  # the other 2 seeds pooled
        assert row["width_eval"] >= row["width_mean"] > 0  # the curve's draws plus noise: never narrower
    p = res["pooled"]
    assert p["held_out_evals"] == sum(r["n_held"] for r in res["runs"].values())
    assert p["cover_eval"] >= p["cover_mean"] and p["seeds_left_out"] == 6
    text = markdown(res)
    assert sum(line.startswith(f"| {STUDY.name}/") for line in text.splitlines()) == 6 and "Pooled over 6 runs" in text
    assert f"| {STUDY.name} (6 runs) | {p['held_out_evals']} |" in text and "| **all 6 runs** |" in text


def _row(n_held, in_eval, in_mean, final_in, before=None, in_before=None, seed_in=None):
    row = {"n_held": n_held, "cover_eval": in_eval / n_held, "cover_mean": in_mean / n_held, "final_in_mean": final_in,
           "final_in_eval": final_in, "held_before_departure": n_held if before is None else before,
           "in_eval_before_departure": in_eval if in_before is None else in_before, "misses": n_held - in_eval,
           "misses_after_departure": 0, "misses_in_runs": 0}
    if seed_in is not None:
        row["final_in_seed_band"] = seed_in
    return row


def test_the_pooled_table_counts_each_folder_the_held_out_folders_and_all_runs():
    """Counts worked by hand: folder a has 10 + 20 held-out evals with 9 + 15 inside one eval's interval (80 %), 7 + 10
    in the mean curve's band (56.7 %), the second run leaving its law after 12 evals of which 11 were inside
    (20 of 22 before a departure: 90.9 %); folder b, held out of every choice: 10 evals, 10 inside, 6 in the mean band.
    All: 34 of 40 (85 %), 30 of 32 before a departure (93.8 %)."""
    from scalerl_jax.benchmarks.calibration import pooled_table

    runs = {"a/x_s0": _row(10, 9, 7, True, seed_in=True), "a/x_s1": _row(20, 15, 10, False, 12, 11, seed_in=False),
            "b/x_s5": _row(10, 10, 6, True)}
    lines = pooled_table({"runs": runs}, held_out=["b"]).splitlines()
    assert lines[2] == "| a (2 runs) | 30 | 56.7% | 80.0% | 90.9% (22 evals) | 1 of 2 | 1 of 2 |"
    assert lines[3] == "| b (1 runs), held out | 10 | 60.0% | 100.0% | 100.0% (10 evals) | 1 of 1 | - |"
    assert lines[4] == "| **held out of every choice: 1 runs** | 10 | 60.0% | 100.0% | 100.0% (10 evals) | 1 of 1 | - |"
    assert lines[5] == "| **all 3 runs** | 40 | 57.5% | 85.0% | 93.8% (32 evals) | 2 of 3 | 1 of 2 |"
    assert len(lines) == 6


def test_held_out_must_name_a_folder(tmp_path, capsys):
    from scalerl_jax.benchmarks.calibration import main

    with pytest.raises(SystemExit):
        main([str(tmp_path), "--held-out", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert f"--held-out {tmp_path / 'missing'}: not a folder" in err
