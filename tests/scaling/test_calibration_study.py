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
