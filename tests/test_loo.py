"""experiments.loo: variants share one warm start per seed, finished runs of the planned config are skipped (others
run again), a user's own model and data run every variant, the report compares them."""

import dataclasses
import json

import pytest
from scalerl_jax.experiments import loo, presets
from scalerl_jax.experiments.base_models import shared_warm_start, warm_start_key
from scalerl_jax.experiments.presets import build_plan
from scalerl_jax.experiments.report import compare
from scalerl_jax.experiments.store import config_differences

from scalerl_jax.config import ConfigError
from tests.conftest import printed_json

R = dataclasses.replace

PRINTED = 0.5e-3 * (1 + 1e-9)  # a value printed with 3 decimals (the comparison table): within half a unit
MC_SIGMAS = 6  # Monte Carlo tolerances: standard errors (a normal's two tails beyond 6: 2e-9)


def _micro_plan(seed: int = 0):
    """A run small enough for CI: 2-layer model, 200 small warm-start steps, 6 RL steps evaluated after each, no
    live forecast (tests/scaling/test_forecast.py and the smoke run test it; here it would only add a process)."""
    p = presets.smoke_plan(seed)
    e = p.exp
    model = R(e.model, d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32, ffn_dim=128)
    exp = R(e, model=model, data=R(e.data, val_size=16),
            rollout=R(e.rollout, prompts_per_batch=4, group_size=4, k=2),
            train=R(e.train, steps=6, eval_every=1, eval_samples=1, checkpoint_every=3),
            forecast=R(e.forecast, enabled=False))
    return R(p, exp=exp, warm_steps=200, warm_batch=32, warm_warmup=20, warm_unmarked_frac=0.0)


def test_warm_start_key_ignores_only_the_head_dtype():
    base = build_plan("tiny", "scalerl", seed=0)
    assert warm_start_key(build_plan("tiny", "bf16_head", seed=0)) == warm_start_key(base)
    assert warm_start_key(build_plan("tiny", "no_npr", seed=0)) == warm_start_key(base)  # RL-side change
    assert warm_start_key(build_plan("tiny", "scalerl", seed=1)) != warm_start_key(base)
    wider = R(base, exp=R(base.exp, model=R(base.exp.model, d_model=256)))
    assert warm_start_key(wider)["model"]["d_model"] == 256 != warm_start_key(base)["model"]["d_model"]
    assert warm_start_key(R(base, warm_steps=7)) != warm_start_key(base)
    # the arithmetic's range is the warm start's data: another b_max is another base model
    b_maxes = [warm_start_key(R(base, exp=R(base.exp, data=R(base.exp.data, arith_b_max=b)))) for b in (19, 20, 99)]
    assert b_maxes[0] != b_maxes[1] != b_maxes[2] != b_maxes[0]


def test_shared_warm_start_refuses_another_key(tmp_path):
    plan = build_plan("tiny", "scalerl", seed=0)
    assert shared_warm_start(plan, tmp_path) is None  # nothing there yet
    (tmp_path / "config.json").write_text("{}")
    assert shared_warm_start(plan, tmp_path) is None  # a half-written warm start (no key file) is not reused
    (tmp_path / "warmstart_key.json").write_text(json.dumps(warm_start_key(plan)))
    assert shared_warm_start(plan, tmp_path) == tmp_path
    with pytest.raises(ConfigError, match=r"differs in: data\.seed, seed\)"):
        shared_warm_start(build_plan("tiny", "scalerl", seed=1), tmp_path)


def micro_study(out_dir: str) -> dict:
    """Run by tests/_loo_study.py in the suite's background lane: the ``micro`` study of ScaleRL and the bf16 head,
    then the same command again; each call's exit status and printed output."""
    import contextlib
    import io

    presets.PRESETS["micro"] = _micro_plan
    out, store = f"{out_dir}/loo", f"{out_dir}/store"
    cmd = ["--preset", "micro", "--variants", "scalerl", "bf16_head", "--out", out, "--store", store]
    res = {"out": out, "store": store, "rc": [], "printed": []}
    for _ in range(2):
        with contextlib.redirect_stdout(io.StringIO()) as f:
            res["rc"].append(loo.main(cmd))
        res["printed"].append(f.getvalue())
    return res


@pytest.mark.extended
@pytest.mark.background("loo_micro_study", ["tests/_loo_study.py", "{out}"])
def test_loo_shares_the_warm_start_skips_finished_runs_and_compares(background):
    from pathlib import Path

    res = printed_json(background["loo_micro_study"])
    out, store, (first, again) = Path(res["out"]), Path(res["store"]), res["printed"]
    assert res["rc"] == [0, 0], first[-3000:] + again[-3000:]
    assert first.count("supervised warm start:") == 1 and first.count("reusing the warm start") == 1
    ws = out / "warmstart_s0"
    assert (ws / "model.safetensors").exists() and (ws / "warmstart_key.json").exists()
    runs = {}
    for name in ("scalerl_s0", "bf16_head_s0"):
        s = json.loads((out / name / "summary.json").read_text())["run"]
        assert s["steps"] == 6 and s["warmstart_dir"] == str(ws)
        runs[name] = s
        assert json.loads((out / name / "config.json").read_text())["model"]["head_dtype"] == (
            "bfloat16" if name.startswith("bf16") else "float32")
    assert runs["scalerl_s0"]["warmstart_seconds"] > 0 and runs["bf16_head_s0"]["warmstart_seconds"] == 0
    table = (out / "comparison" / "comparison.md").read_text()
    assert "(`flops`)" in table  # counted compute is the main axis; device-hours in their own folder
    assert (out / "comparison" / "curves.png").exists() and (out / "comparison" / "A_posteriors.png").exists()
    assert "(`device_hours`)" in (out / "comparison_device_hours" / "comparison.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "_s0" in line]
    assert [r.split("|")[1].strip() for r in rows] == ["scalerl_s0", "bf16_head_s0"]
    cells = [r.split("|") for r in rows]
    assert cells[0][3].strip() == cells[0][7].strip() == ""  # no delta / P(A_ScaleRL > A) for ScaleRL itself
    assert 0.0 <= float(cells[1][7]) <= 1.0 and 0.0 <= float(cells[1][8]) <= 1.0
    end = {n: float(c[2]) for n, c in zip(("scalerl", "bf16"), cells)}
    # the table prints 3 decimals: each end within half a unit, their difference printed rounded once more
    assert float(cells[1][3]) == pytest.approx(end["bf16"] - end["scalerl"], abs=3 * PRINTED)
    # each finished run's small files are in the store (no checkpoints), the comparison beside them
    for name in ("scalerl_s0", "bf16_head_s0"):
        kept = sorted(p.relative_to(store / name).as_posix() for p in (store / name).rglob("*") if p.is_file())
        assert {"config.json", "metrics.jsonl", "stored.json", "summary.json"} <= set(kept), kept
        # nothing else but the report and its figures: no checkpoints, weights or warm start
        assert all(k in ("report.md",) or (k.startswith("fit/") and k.endswith(".png")) for k in set(kept) - {
            "config.json", "metrics.jsonl", "stored.json", "summary.json"}), kept
        assert (store / name / "metrics.jsonl").read_text() == (out / name / "metrics.jsonl").read_text()
    assert (store / "comparison" / "comparison.md").read_text() == table
    # re-issuing the command runs nothing again
    assert again.count("finished earlier with the same config, skipping") == 2 and "warm start" not in again


def _write_curve(run_dir, A, B=1.5, c_mid=0.02, r0=0.3, n=16, noise=0.0, seed=0):
    """Eval rows that follow the sigmoid law R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) worked by hand."""
    import numpy as np

    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True)
    c = np.linspace(0.0, 0.1, n)
    written = []
    with open(run_dir / "metrics.jsonl", "w") as f:
        for i, ci in enumerate(c):
            r = r0 if ci == 0 else r0 + (A - r0) / (1 + (c_mid / ci) ** B)
            written.append(float(r + noise * rng.standard_normal()))
            row = {"kind": "eval", "step": i, "device_hours": float(ci), "val_reward": written[-1]}
            f.write(json.dumps(row) + "\n")
    return written


def test_compare_ranks_ceilings_and_lists_unfittable_runs(tmp_path):
    runs = tmp_path / "runs"
    ref = _write_curve(runs / "scalerl_s0", A=0.8, noise=0.01, seed=1)
    low = _write_curve(runs / "no_npr_s0", A=0.5, noise=0.01, seed=2)
    _write_curve(runs / "dapo_s0", A=0.8, n=3)  # too short to fit
    summary = compare([runs / "scalerl_s0", runs / "no_npr_s0", runs / "dapo_s0"], tmp_path / "cmp",
                          compute_key="device_hours")
    assert set(summary["runs"]) == {"scalerl_s0", "no_npr_s0"} and "dapo_s0" in summary["not_fitted"]
    a = {n: e["bayes"].get("summary", e["bayes"])["A"]["mean"] for n, e in summary["runs"].items()}
    # each fitted ceiling holds the truth within its own 90 % interval's width (3.3 posterior sd)
    for name, truth in (("scalerl_s0", 0.8), ("no_npr_s0", 0.5)):
        post = summary["runs"][name]["bayes"].get("summary", summary["runs"][name]["bayes"])["A"]
        assert abs(a[name] - truth) <= post["hi"] - post["lo"], (name, post)
    rows = {r.split("|")[1].strip(): r.split("|") for r in (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
            if r.startswith("| ") and "_s0" in r}
    assert float(rows["no_npr_s0"][7]) > 0.95  # P(A_ScaleRL > A_no_npr): 0.8 vs 0.5
    # the end reward is the mean of the last 3 evals written, the delta is against ScaleRL of the same seed
    end_ref, end_low = sum(ref[-3:]) / 3, sum(low[-3:]) / 3
    assert float(rows["scalerl_s0"][2]) == pytest.approx(end_ref, abs=PRINTED)
    assert float(rows["no_npr_s0"][2]) == pytest.approx(end_low, abs=PRINTED)
    assert float(rows["no_npr_s0"][3]) == pytest.approx(end_low - end_ref, abs=PRINTED)
    assert "not fitted" in rows["dapo_s0"][4]
    assert (tmp_path / "cmp" / "curves.png").stat().st_size > 0  # no_npr's panel over ScaleRL's curve
    with pytest.raises(ValueError, match=r"fit_until .* got 1.5"):
        compare([runs / "scalerl_s0"], tmp_path / "cmp2", fit_until=1.5)


def test_compare_writes_its_table_when_nothing_can_be_fitted(tmp_path):
    _write_curve(tmp_path / "scalerl_s0", A=0.8, n=3)
    (tmp_path / "gspo_s0").mkdir()  # a run that never wrote metrics
    summary = compare([tmp_path / "scalerl_s0", tmp_path / "gspo_s0"], tmp_path / "new" / "cmp",
                          compute_key="device_hours")
    assert summary["runs"] == {} and set(summary["not_fitted"]) == {"scalerl_s0", "gspo_s0"}
    table = (tmp_path / "new" / "cmp" / "comparison.md").read_text()
    assert "| gspo_s0 | nan |  | not fitted: no metrics.jsonl" in table


def test_loo_rejects_a_bad_override_before_running_anything(tmp_path, capsys):
    with pytest.raises(SystemExit):
        loo.main(["--preset", "tiny", "--variants", "scalerl", "--set", "data.n_trian=5", "--out", str(tmp_path)])
    assert "DataConfig has no field 'n_trian'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    with pytest.raises(SystemExit):
        loo.main(["--preset", "tiny", "--fit-until", "0", "--out", str(tmp_path)])
    assert "--fit-until is a fraction" in capsys.readouterr().err


def test_first_seed_plans_later_seeds_only(tmp_path, capsys):
    """--first-seed 5 --seeds 2 adds seeds 5 and 6 of a recipe (each run's config carries its seed), none earlier."""
    args, plans = loo.parse_runs(["--preset", "tiny", "--variants", "scalerl", "--seeds", "2", "--first-seed", "5"])
    assert sorted(plans) == [("scalerl", 5), ("scalerl", 6)]
    assert [plans["scalerl", s].exp.train.seed for s in (5, 6)] == [5, 6]
    with pytest.raises(SystemExit):
        loo.main(["--preset", "tiny", "--variants", "scalerl", "--first-seed", "-1", "--out", str(tmp_path)])
    assert "--first-seed a seed >= 0" in capsys.readouterr().err


def test_over_seeds_averages_paired_draws_as_the_normal_formula_says():
    """Seed averages of independent normal posteriors: A_bar ~ N(mean of means, sqrt(sum var) / n), and
    P(A_bar_ref > A_bar_var) = Phi(d / sqrt(var_ref + var_var)) worked from those moments."""
    import math

    import numpy as np

    from scalerl_jax.scaling.compare import over_seeds

    rng = np.random.default_rng(0)
    draws = 40000

    def post(a, sd, b=1.0):
        return {"A": rng.normal(a, sd, draws), "B": rng.normal(b, 0.1, draws)}

    samples = {"scalerl": {"0": post(0.60, 0.03), "1": post(0.62, 0.04), "2": post(0.58, 0.03)},
               "gspo": {"0": post(0.57, 0.03), "1": post(0.60, 0.04), "2": post(0.56, 0.03), "3": post(0.9, 0.01)}}
    out = over_seeds(samples, "scalerl")
    assert out["gspo"]["seeds"] == ["0", "1", "2"]  # seed 3 has no ScaleRL run to pair with
    sd_bar = math.sqrt(0.03**2 + 0.04**2 + 0.03**2) / 3
    # Monte Carlo tolerances: MC_SIGMAS standard errors of each estimate from `draws` draws (the mean: sd / sqrt(n);
    # a normal's 5 % / 95 % quantile: sqrt(0.05 x 0.95) / (phi(1.6449) sqrt(n)) sd, the width's relative error
    # sqrt(2) times that over 3.29 sd; a probability p: sqrt(p (1 - p) / n))
    se_mean = sd_bar / math.sqrt(draws)
    se_width_rel = math.sqrt(2) * math.sqrt(0.05 * 0.95) / (0.10314 * math.sqrt(draws)) / (2 * 1.6449)
    assert out["gspo"]["A"]["mean"] == pytest.approx((0.57 + 0.60 + 0.56) / 3, abs=MC_SIGMAS * se_mean)
    assert out["gspo"]["A"]["hi"] - out["gspo"]["A"]["lo"] == pytest.approx(2 * 1.6449 * sd_bar,
                                                                             rel=MC_SIGMAS * se_width_rel)
    d = (0.60 + 0.62 + 0.58) / 3 - (0.57 + 0.60 + 0.56) / 3
    expect = 0.5 * (1 + math.erf(d / (sd_bar * math.sqrt(2)) / math.sqrt(2)))
    se_p = math.sqrt(expect * (1 - expect) / draws)
    assert out["gspo"]["P_A_ref_gt"] == pytest.approx(expect, abs=MC_SIGMAS * se_p)
    assert out["gspo"]["seeds_A_ref_gt"] == 3
    assert out["gspo"]["P_B_ref_gt"] == pytest.approx(0.5, abs=MC_SIGMAS * math.sqrt(0.25 / draws))
    assert "P_A_ref_gt" not in out["scalerl"]
    with pytest.raises(ValueError, match="no runs of the reference recipe 'scalerl'"):
        over_seeds({"gspo": samples["gspo"]}, "scalerl")


def seeds_compared(out_dir: str) -> dict:
    """Run by tests/_loo_study.py (``compare``) in the suite's background lane: 2 seeds of 2 recipes written on the
    law by hand (A = 0.8 and 0.55, + 0.01 per seed), compared on their first half; where they are, and the summary's
    over-seeds part."""
    from pathlib import Path

    runs, dirs = Path(out_dir) / "runs", []
    for seed in range(2):
        for variant, a in (("scalerl", 0.8), ("gspo", 0.55)):
            _write_curve(runs / f"{variant}_s{seed}", A=a + 0.01 * seed, n=24, noise=0.005, seed=10 * seed + len(dirs))
            dirs.append(runs / f"{variant}_s{seed}")
    summary = compare(dirs, Path(out_dir) / "cmp", compute_key="device_hours", fit_until=0.5)
    return {"dirs": [str(d) for d in dirs], "cmp": str(Path(out_dir) / "cmp"), "over_seeds": summary["over_seeds"]}


@pytest.mark.extended
@pytest.mark.background("loo_seeds_compared", ["tests/_loo_study.py", "{out}", "compare"])
def test_compare_averages_seeds_and_scores_half_compute_predictions(background):
    from pathlib import Path

    res = printed_json(background["loo_seeds_compared"])
    dirs, cmp = [Path(d) for d in res["dirs"]], Path(res["cmp"])
    seeds = res["over_seeds"]
    assert seeds["gspo"]["seeds"] == ["0", "1"] and seeds["gspo"]["P_A_ref_gt"] > 0.95
    # the seeds' mean ceiling holds the truth (0.8 and 0.81) within its own 90 % interval's width (3.3 sd)
    a = seeds["scalerl"]["A"]
    assert abs(a["mean"] - 0.805) <= a["hi"] - a["lo"], a
    text = (cmp / "comparison.md").read_text()
    assert "## Over seeds" in text and (cmp / "A_over_seeds.png").stat().st_size > 0
    # the prediction table: per run the first half's prediction of the last eval, and each variant's mean error
    text, seeds_part = text.split("## Where another seed would end")
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")] for r in text.splitlines()
            if r.startswith("| ") and "]" in r and "_s" in r.split("|")[1]}
    last = {d.name: json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])["val_reward"] for d in dirs}
    for name, cells in rows.items():
        if name in last and "%" not in cells[2]:
            assert float(cells[3]) == pytest.approx(last[name], abs=PRINTED)  # observed = the last eval written
            # a clean sigmoid past its midpoint extrapolates well: within the prediction's own interval's width
            assert abs(float(cells[4])) <= float(cells[6]) + PRINTED, cells
    assert "| scalerl | 2 |" in text and "| gspo | 2 |" in text
    # where another seed would end: the two seeds of each recipe fitted together give a new seed's band at the end,
    # which holds both seeds' last evals (their truths 0.01 apart, noise 0.005) and is no wider than the prior's 90 %
    # spread of ceilings allows (0.82 in logit((A - R0) / (1 - R0)): +-0.12 in A at A 0.8 from R0 0.3, +-0.15 at the
    # steepest); each seed left out is held against the band of the other seed's fit alone (its spread the prior's)
    rows = [[c.strip() for c in r.split("|")] for r in seeds_part.splitlines() if r.startswith("| ")]
    pooled = {cells[1].split(":")[0]: cells for cells in rows if "seeds pooled" in cells[1]}
    left = {cells[1].split()[0]: cells for cells in rows if cells[1].endswith(" left out") and "_s" in cells[1]}
    assert set(pooled) == {"scalerl", "gspo"} and set(left) == {d.name for d in dirs}
    for name, cells in left.items():
        lo, hi = (float(x) for x in pooled[name.rsplit("_s", 1)[0]][2].strip("[]").split(","))
        assert lo <= float(cells[3]) <= hi and hi - lo < 0.3, (name, cells, lo, hi)
        assert float(cells[3]) == pytest.approx(last[name], abs=PRINTED)
    assert sum(cells[4] == "yes" for cells in left.values()) >= 3, left


def _micro_own_plan(seed: int = 0):
    """The micro recipe on a user's model and data (--model, --data): short budgets, no length control. A random
    model solves nothing, so zero-variance groups are kept: every batch then updates (with zero advantages)."""
    p = _micro_plan(seed)
    e = p.exp
    exp = R(e, data=R(e.data, template="{question}", val_size=8), loss=R(e.loss, filter_zero_variance=False),
            rollout=R(e.rollout, max_prompt_len=28, max_new_tokens=12, length=R(e.rollout.length, kind="none")),
            train=R(e.train, eval_every=1, eval_samples=1, checkpoint_every=100))
    return R(p, exp=exp)


@pytest.fixture(scope="module")
def own_base(tmp_path_factory):
    """A random transformers Llama beside a BPE tokenizer trained on its data, and that data as jsonl."""
    from scalerl_jax.data.tokenizer_build import train_bpe_tokenizer
    from scalerl_jax.data.word_arith import word_arith_rows, write_jsonl
    from tests.hf_models import make_hf_llama

    d = tmp_path_factory.mktemp("own")
    rows = word_arith_rows(48, seed=0)
    data = write_jsonl(rows, d / "questions.jsonl")
    model_dir = train_bpe_tokenizer([r["question"] + " " + r["answer"] for r in rows], d / "model", vocab_size=512)
    from scalerl_jax.data.tokenizer import HFTokenizer

    make_hf_llama(model_dir, vocab=HFTokenizer(str(model_dir)).vocab_size, hidden=32, layers=2, heads=2,
                  kv_heads=1, ffn=64, llama3_rope=False)
    return model_dir, data


@pytest.mark.heavy
@pytest.mark.slow  # 4 short runs (about 50 s of CPU; 2-3 minutes on a loaded 2-core machine)
def test_loo_on_your_own_model_reruns_a_run_whose_config_changed(own_base, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(presets.PRESETS, "micro", _micro_own_plan)
    model_dir, data = own_base
    out = tmp_path / "loo"
    cmd = ["--preset", "micro", "--model", str(model_dir), "--data", str(data), "--variants", "scalerl", "gspo",
           "--seeds", "1", "--out", str(out), "--store", "none"]
    # 2 steps give 3 evals: too few to fit, which the exit status and the table say (the runs themselves finished)
    assert loo.main([*cmd, "--steps", "2"]) == 1
    first = capsys.readouterr().out
    assert "warm start" not in first and first.count("[loo] running") == 2
    for name, loss in (("scalerl_s0", "cispo"), ("gspo_s0", "gspo")):
        cfg = json.loads((out / name / "config.json").read_text())
        assert cfg["loss"]["kind"] == loss and cfg["train"]["steps"] == 2 and cfg["data"]["path"] == str(data)
        assert cfg["base_model"] == str(model_dir) and cfg["model"]["d_model"] == 32  # the checkpoint's shape
        assert json.loads((out / name / "summary.json").read_text())["run"]["steps"] == 2
    assert "not fitted: 3 evals in the fit window, need 5" in (out / "comparison" / "comparison.md").read_text()
    # the same command again reuses both; another --steps reruns both, keeping the earlier runs
    assert loo.main([*cmd, "--steps", "2"]) == 1
    assert capsys.readouterr().out.count("finished earlier with the same config, skipping") == 2
    assert loo.main([*cmd, "--steps", "3"]) == 1
    again = capsys.readouterr().out
    assert again.count("train.steps: ran 2, planned 3") == 2 and again.count("[loo] running") == 2
    for name in ("scalerl_s0", "gspo_s0"):
        assert json.loads((out / name / "summary.json").read_text())["run"]["steps"] == 3
        kept = out / "superseded" / f"{name}.1"
        assert json.loads((kept / "summary.json").read_text())["run"]["steps"] == 2


def test_config_differences_compare_what_the_plan_decides(tmp_path):
    """config.json as the run writes it: the checkpoint's architecture, the base model, sandbox_active."""
    from scalerl_jax.experiments.numerics import model_from_checkpoint

    from scalerl_jax.models import tiny

    plan = R(build_plan("smoke", "scalerl", seed=0), base_model=str(tmp_path / "model"))
    plan = R(plan, exp=R(plan.exp, out_dir=str(tmp_path / "scalerl_s0")))
    ckpt = R(tiny(), d_model=48, n_layers=3, vocab_size=300)
    exp = R(plan.exp, model=model_from_checkpoint(plan.exp.model, ckpt))
    written = {**json.loads(json.dumps(dataclasses.asdict(exp), default=str)), "base_model": str(tmp_path / "model"),
               "sandbox_active": {"isolation": "unused (no code prompts)"}}
    assert config_differences(plan, written) == []
    assert config_differences(R(plan, exp=R(plan.exp, out_dir="elsewhere")), written) == []  # where, not what
    other = R(plan, exp=R(plan.exp, train=R(plan.exp.train, steps=7, lr=1e-3)))
    assert config_differences(other, written) == [f"train.lr: ran {plan.exp.train.lr}, planned 0.001",
                                                      f"train.steps: ran {plan.exp.train.steps}, planned 7"]
    bf16 = R(plan, exp=R(plan.exp, model=R(plan.exp.model, head_dtype="bfloat16")))
    assert config_differences(bf16, written) == ['model.head_dtype: ran "float32", planned "bfloat16"']
    moved = R(plan, base_model=str(tmp_path / "other"))
    assert config_differences(moved, written) == [
        f'base_model: ran "{tmp_path / "model"}", planned "{tmp_path / "other"}"']
    old = {k: v for k, v in written.items() if k != "loss"}
    assert config_differences(plan, old)[0].startswith("loss.kind: ran nothing (absent), planned")
    # the forecast's compute axis and NUTS sizes shape only its rows: still the planned run; a stop rule is not
    fc = plan.exp.forecast
    other_axis = "device_hours" if fc.compute_key == "flops" else "flops"
    analysis = R(plan, exp=R(plan.exp, forecast=R(fc, compute_key=other_axis, num_samples=50, enabled=False)))
    assert config_differences(analysis, written) == []
    stops = R(plan, exp=R(plan.exp, forecast=R(fc, stop_if_worse=0.9, baseline="runs/base")))
    assert config_differences(stops, written) == ['forecast.baseline: ran null, planned "runs/base"',
                                                      "forecast.stop_if_worse: ran null, planned 0.9"]
