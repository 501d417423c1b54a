"""benchmarks/bench_loop.py: the step breakdown it prints, worked by hand on written train and eval rows, and the
loop timings the trainer writes (a short run: every part is there, and they fit inside the step's wall time)."""

import dataclasses

import numpy as np
import pytest
from scalerl_jax.benchmarks.bench_loop import breakdown, spread

from tests.tolerances import ops


def _train(step, loop, wait=0.5, flops=None):
    return {"kind": "train", "step": step, "loop_seconds": loop, "wait_seconds": wait, "batch_seconds": 0.1,
            "step_seconds": 1.0, "weight_sync_seconds": 0.2, "gen_seconds": 1.5, "score_seconds": 0.05,
            "flops": flops if flops is not None else 100.0 * step, "completion_len": 20.0}


def test_breakdown_splits_the_loop_and_takes_the_eval_out():
    rows = [{"kind": "eval", "step": 0, "eval_seconds": 3.0},
            _train(1, 9.0, wait=4.0),  # the first step: compilation, reported apart
            {"kind": "eval", "step": 2, "eval_seconds": 0.8}, _train(2, 2.0), _train(3, 2.8), _train(4, 2.0)]
    rows.insert(3, rows.pop(2))  # the eval after step 2 is written before step 3's row
    b = breakdown(rows, skip=1, eval_every=2)
    assert b["steady_steps"] == 3 and b["first_steps_s"] == [9.0]
    # float64 means of a few hand values on both sides: each within gamma_k of the exact value (k: the sums' adds and
    # the division, tests/tolerances.py), so within twice that of each other
    mean3 = 2 * ops(3, "float64")
    assert b["loop_seconds"] == pytest.approx((2.0 + 2.8 + 2.0) / 3, rel=mean3)
    assert b["eval_in_loop"] == pytest.approx(0.8 / 3, rel=mean3)  # step 3's loop holds the eval after step 2
    # the rest: 2.2667 - (0.5 + 0.1 + 1.0 + 0.2 + 0.2667) = 0.2, a difference that cancels: the roundings of its
    # ~10 operations count against the loop's 2.27 s, not against the 0.2
    assert b["other"] == pytest.approx(0.2, abs=2 * ops(10, "float64") * 2.3)
    assert b["flops_per_step"] == pytest.approx(100.0, rel=mean3)  # the counted FLOPs grow by 100 a step
    assert b["eval_seconds"] == pytest.approx((3.0 + 0.8) / 2, rel=mean3)
    assert b["eval_per_step"] == pytest.approx(1.9 / 2, rel=mean3)
    # without the compilation steps set apart, step 1's loop still holds no eval: the step-0 eval precedes the loop
    assert breakdown(rows, skip=0, eval_every=2)["eval_in_loop"] == pytest.approx(0.8 / 4, rel=mean3)


def test_spread_separates_the_row_count_from_the_swing():
    """Worked by hand: steps of 128 rows at 1.0 / 1.2 / 0.8 s and of 256 rows at 2.0 / 2.0 / 2.0 s (time proportional
    to rows, so per row they are 1/128 x (1.0, 1.2, 0.8, 1.0, 1.0, 1.0)), one step of 64 rows at 0.5 s (per row
    1/128) that is in no group of three."""
    times = [(128, 1.0), (128, 1.2), (128, 0.8), (256, 2.0), (256, 2.0), (256, 2.0), (64, 0.5)]
    rows = [{"loop_seconds": t + 0.1, "step_seconds": t, "train_rows": n} for n, t in times]
    s = spread(rows)
    loops = np.array([t + 0.1 for _, t in times])
    assert s["loop_cv"] == pytest.approx(loops.std() / loops.mean(), rel=4 * ops(7, "float64"))
    # per row: (1.0, 1.2, 0.8, 1.0, 1.0, 1.0, 1.0) / 128: mean 1/128, sd sqrt(0.08 / 7) / 128
    assert s["per_row_cv"] == pytest.approx(np.sqrt(0.08 / 7), rel=4 * ops(7, "float64"))
    # 128 rows: sd sqrt(0.08 / 3), mean 1.0; 256 rows: cv 0; pooled by step count (3 and 3)
    assert s["same_rows_cv"] == pytest.approx(np.sqrt(0.08 / 3) / 2, rel=4 * ops(7, "float64"))
    assert s["same_rows_steps"] == 6
    assert np.isnan(spread(rows[:1])["loop_cv"])


@pytest.mark.extended  # a short run of 20 s whose rows the breakdown reads; the breakdown itself is tested above
def test_the_trainer_writes_the_loop_timings(tmp_path):
    import json

    import jax
    from scalerl_jax.experiments.presets import build_plan
    from scalerl_jax.experiments.run_path import build_trainer

    from scalerl_jax.data.pipeline import build_prompt_data
    from scalerl_jax.data.tokenizer import CharTokenizer
    from scalerl_jax.models import init_params

    R = dataclasses.replace

    def score(completions, problems):  # +1 iff the completion's length is even: every group has variance
        return np.array([1.0 if len(c) % 2 == 0 else -1.0 for c in completions], np.float32), {"timeouts": 0}

    plan = build_plan("tiny", "scalerl")
    small = R(plan.exp.model, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64)
    exp = R(plan.exp, model=small, out_dir=str(tmp_path / "run"),
            rollout=R(plan.exp.rollout, prompts_per_batch=4, group_size=4, k=2),
            train=R(plan.exp.train, steps=3, eval_every=2, eval_samples=1, checkpoint_every=100))
    said = []
    trainer = build_trainer(R(plan, exp=exp), init_params(small, jax.random.key(0), std=0.5),
                            build_prompt_data("arith", val_size=8, seed=0), tok=CharTokenizer(),
                            score=score, log=said.append)
    try:
        trainer.run()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    train = [r for r in rows if r["kind"] == "train"]
    # evals at steps 0, 2 and 3 (the last): 3 < forecast.min_evals, so no refit process was started for it
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [0, 2, 3]
    assert any("[forecast] off: this run makes 3 evals" in s for s in said), said
    assert trainer.forecast is None
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        parts = r["wait_seconds"] + r["batch_seconds"] + r["step_seconds"] + r["weight_sync_seconds"]
        assert min(r["wait_seconds"], r["batch_seconds"], r["score_seconds"]) >= 0
        # the parts happen inside the step's wall time: differences of the same clock, summed in float64 (a
        # microsecond covers the clock's resolution as well)
        assert parts <= r["loop_seconds"] + 1e-6, r
