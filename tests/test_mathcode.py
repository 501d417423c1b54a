"""Math + code multi-task runs: the prompt mixture, the synthetic code task and its sandboxed reward, per-task eval
rows and per-task scaling fits, the tiny_mathcode preset."""

import json
import warnings

import numpy as np
import pytest

from scalerl_jax.config import ConfigError, DataConfig, ExperimentConfig, SandboxSettings
from scalerl_jax.data.code_synth import CODE_ID_OFFSET, FX_SPACE, FX_SYMBOLS, fx_problem, fx_split, program_text
from scalerl_jax.data.pipeline import MixtureIterator, PromptData, from_config
from scalerl_jax.data.tasks import Problem, arith_problem

# ---- the mixture -------------------------------------------------------------------------------------------------


def _problems(n_math=40, n_code=30):
    math = [arith_problem(a, 2 + a % 50, 2 + a % 8) for a in range(n_math)]
    code = [fx_problem(1 + i % 20, i // 20) for i in range(n_code)]
    return math + code


def test_mixture_gives_each_batch_its_weight_and_is_deterministic():
    probs = _problems()
    it = MixtureIterator(probs, {"math": 0.75, "code": 0.25}, seed=3)
    batches = [it.next_batch(16) for _ in range(20)]  # 320 prompts: several epochs of both tasks
    for b in batches:
        assert sum(p.task == "code" for p in b) == 4  # 16 x 0.25 exactly
    # any window of n consecutive prompts holds n * weight of each task, within one
    flat = [p.task == "code" for b in batches for p in b]
    for n in (5, 7, 33):
        for start in range(0, len(flat) - n, 11):
            assert abs(sum(flat[start:start + n]) - 0.25 * n) <= 1  # counts of whole prompts: within one prompt
    # each task is drawn without replacement within its epoch: its first 30 code prompts are the 30 code problems
    code_ids = [p.prompt_id for b in batches for p in b if p.task == "code"][:30]
    assert sorted(code_ids) == sorted(p.prompt_id for p in probs if p.task == "code")
    # determinism per seed
    again = MixtureIterator(probs, {"math": 0.75, "code": 0.25}, seed=3)
    assert [p.prompt_id for p in again.next_batch(320)] == [p.prompt_id for b in batches for p in b]
    other = MixtureIterator(probs, {"math": 0.75, "code": 0.25}, seed=4)
    assert [p.prompt_id for p in other.next_batch(64)] != [p.prompt_id for b in batches[:4] for p in b]


def test_mixture_state_restores_the_next_prompt():
    probs = _problems()
    a = MixtureIterator(probs, {"math": 0.5, "code": 0.5}, seed=0)
    a.next_batch(45)
    state = json.loads(json.dumps(a.get_state()))  # it goes into a JSON checkpoint
    want = [p.prompt_id for p in a.next_batch(50)]
    b = MixtureIterator(probs, {"math": 0.5, "code": 0.5}, seed=0)
    b.set_state(state)
    assert [p.prompt_id for p in b.next_batch(50)] == want


def test_mixture_refuses_weights_that_do_not_match_the_tasks():
    with pytest.raises(ValueError, match="weights for tasks"):
        MixtureIterator(_problems(), {"math": 1.0}, seed=0)
    with pytest.raises(ValueError, match="sum to 1"):
        MixtureIterator(_problems(), {"math": 0.5, "code": 0.6}, seed=0)


def test_from_config_mixes_the_synthetic_code_task_in():
    cfg = DataConfig(source="arith", val_size=50, n_train=500, code_source="synthetic", code_weight=0.5,
                     code_val_size=40, seed=1)
    data = from_config(cfg)
    assert data.weights == {"math": 0.5, "code": 0.5} and data.tasks == ["code", "math"]
    assert sum(p.task == "code" for p in data.val) == 40 and sum(p.task == "math" for p in data.val) == 50
    assert sum(p.task == "code" for p in data.train) == FX_SPACE - 40
    ids = [p.prompt_id for p in (*data.train, *data.val)]
    assert len(set(ids)) == len(ids)  # NPR keys never collide across tasks
    assert all((p.prompt_id >= CODE_ID_OFFSET) == (p.task == "code") for p in data.train)
    code_val = {p.prompt for p in data.val if p.task == "code"}
    assert not code_val & {p.prompt for p in data.train}  # no validation prompt is trained on
    assert isinstance(data.train_iterator(), MixtureIterator)


def test_data_config_checks_name_the_field():
    with pytest.raises(ConfigError, match="code_weight"):
        DataConfig(code_source="synthetic", code_weight=1.0)
    with pytest.raises(ConfigError, match="code_path"):
        DataConfig(code_source="jsonl")
    with pytest.raises(ConfigError, match="isolation"):
        SandboxSettings(isolation="off")
    assert ExperimentConfig().sandbox.isolation == "auto"  # never unsandboxed unless a field says so


# ---- the synthetic code task -------------------------------------------------------------------------------------


def test_fx_task_by_hand():
    p = fx_problem(12, 7)
    assert p.prompt == "f(0)=7,f(1)=19:" and p.solution == "19-7=12#x*12+7" and p.task == "code"
    # the hidden asserts check inputs the prompt does not show, against a*x + b worked by hand
    assert "assert f(2) == 31" in p.code.tests and "assert f(-4) == -41" in p.code.tests
    assert "f(0)" not in p.code.tests and "f(1)" not in p.code.tests
    assert program_text("19-7=12#x*12+7", p) == "x*12+7"
    assert program_text("19-7=12", p) == ""  # never marked an answer: no program
    train, val = fx_split(None, 100, seed=0)
    assert len(val) == 100 and len(train) == FX_SPACE - 100
    assert not {q.prompt_id for q in val} & {q.prompt_id for q in train}


def test_char_tokenizer_of_the_mathcode_vocabulary(tmp_path):
    from scalerl_jax.data.tokenizer import CharTokenizer, HFTokenizer
    from scalerl_jax.data.tokenizer_build import save_char_tokenizer

    tok = HFTokenizer(str(save_char_tokenizer(tmp_path / "t", symbols=FX_SYMBOLS)))
    assert tok.vocab_size == 24
    for text in ("f(0)=7,f(1)=19:", "19-7=12#x*12+7", "7+12*3=", "12*3=36;7+36=43#43"):
        assert tok.decode(tok.encode(text)) == text
    # the arithmetic symbols keep the tiny vocabulary's ids
    assert tok.encode("7+12*3=") == CharTokenizer().encode("7+12*3=")


# ---- the code reward through the real sandbox ----------------------------------------------------------------------


def test_score_runs_code_in_the_sandbox_beside_math():
    from scalerl_jax.rewards import score
    from scalerl_jax.rewards.code_pool import CodePool
    from scalerl_jax.rewards.code_types import SandboxConfig

    code = fx_problem(3, 2)  # f(x) = 3x + 2
    math = arith_problem(7, 12, 3)  # 7 + 36 = 43
    completions = ["5-2=3#x*3+2",  # right
                   "5-2=3#2+3*x",  # right: the sandbox checks behaviour, not text
                   "5-2=3#x*3+3",  # wrong function
                   "5-2=3#(x*3+2)*(x<2)",  # matches both shown examples, fails the hidden asserts
                   "5-2=3",  # no answer marked: no program
                   "5-2=3#x*3+2",  # a duplicate of the first: run once
                   "12*3=36;7+36=43#43"]  # math, exact match
    problems = [code] * 6 + [math]
    with CodePool(SandboxConfig(workers=2)) as pool:
        rewards, counts = score(completions, problems, code_pool=pool)
        runs = pool.stats()["runs"]
        assert pool.isolation in ("bwrap", "rlimits")
    assert rewards.tolist() == [1, 1, -1, -1, -1, 1, 1]
    assert counts["no_answer"] == 1 and counts["sandbox_errors"] == 0
    assert runs == 4  # 5 programs, one of them twice


def test_run_records_the_active_isolation():
    from scalerl_jax.experiments.run_path import code_pool

    pool, meta = code_pool(ExperimentConfig())
    assert pool is None and meta["isolation"].startswith("unused") and meta["configured"] == "auto"
    exp = ExperimentConfig(data=DataConfig(source="arith", code_source="synthetic"),
                           sandbox=SandboxSettings(isolation="rlimits", workers=1))
    pool, meta = code_pool(exp, log=lambda s: None)
    try:
        assert meta["isolation"] == "rlimits" == pool.isolation and meta["configured"] == "rlimits"
    finally:
        pool.close()


# ---- per-task eval rows ------------------------------------------------------------------------------------------


def test_per_task_eval_rows_by_hand():
    from scalerl_jax.train.trainer import per_task_rewards

    m1, m2 = arith_problem(1, 2, 3), arith_problem(4, 5, 6)
    c1 = fx_problem(2, 3)
    rewards = [np.array([1, -1, -1, -1]), np.array([1, 1, -1, -1]), np.array([1, 1, 1, -1])]
    row = per_task_rewards([m1, c1, m2], rewards, "val_reward", "val_n")
    # math: samples (1,-1,-1,-1) + (1,1,1,-1) -> 4 of 8 pass; code: 2 of 4
    assert row == {"val_reward_code": 0.5, "val_n_code": 1, "val_reward_math": 0.5, "val_n_math": 2}
    row = per_task_rewards([m1, c1], [np.array([1, 1]), np.array([-1, -1])], "pass_rate", "n_groups")
    assert row == {"pass_rate_code": 0.0, "n_groups_code": 1, "pass_rate_math": 1.0, "n_groups_math": 1}
    assert per_task_rewards([m1, m2], rewards[:2], "val_reward", "val_n") == {}  # one task: the row is unchanged


def test_prompt_data_tasks():
    d = PromptData(train=[arith_problem(1, 2, 3)], val=[fx_problem(1, 1)])
    assert d.tasks == ["code", "math"]
    assert Problem(0, "q", "a", "s", "math500").task == "math"


# ---- per-task scaling fits ---------------------------------------------------------------------------------------


def _sigmoid(c, A, B, c_mid, r0):
    return np.where(c > 0, r0 + (A - r0) / (1 + (c_mid / np.maximum(c, 1e-12)) ** B), r0)


def test_fit_runs_fits_each_task_and_the_combined_curve(tmp_path):
    from scalerl_jax.scaling import ScalingFitWarning
    from scalerl_jax.scaling.report import fit_runs

    c = np.linspace(0.0, 0.2, 24)
    math = _sigmoid(c, 0.8, 1.5, 0.04, 0.3)
    code = _sigmoid(c, 0.55, 2.0, 0.03, 0.2)
    run = tmp_path / "mc"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for i, ci in enumerate(c):
            f.write(json.dumps({"kind": "train", "step": i, "pass_rate_math": 0.5, "pass_rate_code": 0.4}) + "\n")
            f.write(json.dumps({"kind": "eval", "step": i, "device_hours": ci, "val_reward": (math[i] + code[i]) / 2,
                                "val_reward_math": math[i], "val_reward_code": code[i], "val_n": 200, "val_k": 4,
                                "val_n_math": 100, "val_n_code": 100}) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingFitWarning)
        summary = fit_runs([run], tmp_path / "fit", fit_until=1.0, num_samples=100, num_chains=1, num_warmup=100)
    assert set(summary["runs"]) == {"mc", "mc_math", "mc_code"}
    assert summary["runs"]["mc_code"]["reward_key"] == "val_reward_code"
    assert summary["pairwise"] == [] and summary["paper_rule"] == []  # a run's task curves are not rivals
    # the paper's grid fit recovers each curve's own ceiling (noise-free curves, A on the grid's 0.005 steps): within
    # two of its steps (the fitted B and C_mid trade against A by about one)
    from scalerl_jax.scaling.grid import A_STEP

    assert summary["runs"]["mc_math"]["grid"]["A"] == pytest.approx(0.8, abs=2 * A_STEP + 1e-9)
    assert summary["runs"]["mc_code"]["grid"]["A"] == pytest.approx(0.55, abs=2 * A_STEP + 1e-9)
    assert (tmp_path / "fit" / "fit_mc_code.png").exists() and (tmp_path / "fit" / "fit_mc_math.png").exists()


# ---- the preset --------------------------------------------------------------------------------------------------


def test_tiny_mathcode_plan_and_print_config(capsys):
    from scalerl_jax.experiments.math_8b import main
    from scalerl_jax.experiments.presets import build_plan

    plan = build_plan("tiny_mathcode")
    assert plan.base_kind == "char_mathcode" and plan.exp.model.vocab_size == len(FX_SYMBOLS) + 2
    ro = plan.exp.rollout
    # the longest prompt and completion fit the row: "f(0)=49,f(1)=69:" and "99*9=891;99+891=990#990"
    assert ro.max_prompt_len >= len("f(0)=49,f(1)=69:") and ro.max_prompt_len + ro.max_new_tokens <= plan.seq_len
    assert ro.length.answer_budget >= len("x*20+49") + 1
    assert main(["--preset", "tiny_mathcode", "--set", "data.code_weight=0.25", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["data"]["code_source"] == "synthetic" and cfg["data"]["code_weight"] == 0.25
    assert cfg["sandbox"]["isolation"] == "auto"


def test_code_jsonl_with_humaneval_as_eval():
    from pathlib import Path

    from scalerl_jax.data.code_tasks import HUMANEVAL_SIZE
    from scalerl_jax.data.pipeline import code_split

    toy = str(Path(__file__).resolve().parents[1] / "data" / "code" / "toy.jsonl")
    train, val = code_split("jsonl", path=toy, evaluate="humaneval", render=lambda q: q + "\n\nCode:")
    assert len(train) == 5 and len(val) == HUMANEVAL_SIZE  # every toy row trains; HumanEval validates
    assert all(p.task == "code" and p.code is not None for p in (*train, *val))
    assert val[0].code.task_id == "HumanEval/0" and val[0].prompt.endswith("\n\nCode:")
    ids = [p.prompt_id for p in (*train, *val)]
    assert len(set(ids)) == len(ids) and min(ids) >= CODE_ID_OFFSET
    train, val = code_split("jsonl", path=toy, val_size=2, seed=0)
    assert len(train) == 3 and len(val) == 2
