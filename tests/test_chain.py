"""Addition chains (scalerl_jax/data/chain.py): targets by hand, ids, the split, thinking length against the
tiny_chain preset's budgets, exact-match scoring, and the preset itself."""

import json
from collections import Counter

import numpy as np
import pytest
from scalerl_jax.experiments.presets import build_plan

from scalerl_jax.config import ConfigError, DataConfig
from scalerl_jax.data.chain import (
    chain_depth,
    chain_id,
    chain_operands,
    chain_problem,
    chain_split,
    depth_offset,
    thinking_len,
)
from scalerl_jax.data.pipeline import from_config
from scalerl_jax.data.tokenizer import CharTokenizer
from scalerl_jax.rewards import score


def test_target_by_hand():
    p = chain_problem([3, 4, 5, 9])
    assert p.prompt == "3+4+5+9=" and p.answer == "21" and p.source == "chain"
    assert p.solution == "3+4=7;7+5=12;12+9=21#21"
    assert chain_depth(p) == 3 and thinking_len(p) == len("3+4=7;7+5=12;12+9=21")
    q = chain_problem([9, 9])
    assert (q.prompt, q.solution) == ("9+9=", "9+9=18#18")
    # every symbol is in the tiny task's 17-symbol vocabulary: the character tokenizer round-trips the text
    tok = CharTokenizer()
    for text in (p.prompt, p.solution):
        assert tok.decode(tok.encode(text)) == text


def test_ids_by_hand_and_inverse():
    # depth 1 holds 9 ** 2 = 81 ids, so depth 2 starts at 81; operands are base-9 digits (operand - 1)
    assert depth_offset(1) == 0 and depth_offset(2) == 81 and depth_offset(3) == 81 + 729
    assert chain_id([1, 1]) == 0 and chain_id([9, 9]) == 80
    assert chain_id([1, 1, 1]) == 81 and chain_id([9, 9, 9]) == 81 + 728
    assert chain_id([2, 1, 3]) == 81 + 1 * 81 + 0 * 9 + 2
    rng = np.random.default_rng(0)
    for _ in range(200):
        ops = rng.integers(1, 10, size=int(rng.integers(2, 17))).tolist()
        assert chain_operands(chain_id(ops)) == ops
    with pytest.raises(ValueError, match="operand 10"):
        chain_id([3, 10])
    with pytest.raises(ValueError, match="not a chain id"):
        chain_operands(-1)


def test_split_is_disjoint_deterministic_and_a_prefix():
    train, val = chain_split(300, 100, seed=5)
    ids_t, ids_v = [p.prompt_id for p in train], [p.prompt_id for p in val]
    assert len(set(ids_t)) == 300 and len(set(ids_v)) == 100 and not set(ids_t) & set(ids_v)
    assert ids_v == sorted(ids_v)
    # ids are a function of the problem, never of the seed or position
    assert all(p.prompt_id == chain_id([int(x) for x in p.prompt[:-1].split("+")]) for p in (*train, *val))
    again_t, again_v = chain_split(300, 100, seed=5)
    assert [p.prompt_id for p in again_t] == ids_t and [p.prompt_id for p in again_v] == ids_v
    longer_t, longer_v = chain_split(1000, 100, seed=5)
    assert [p.prompt_id for p in longer_v] == ids_v and [p.prompt_id for p in longer_t[:300]] == ids_t
    other_t, _ = chain_split(300, 100, seed=6)
    assert [p.prompt_id for p in other_t] != ids_t


def test_depth_distribution_is_uniform_over_the_range():
    # depths 3..6 (>= 6561 problems each): 1000 distinct problems repeat only ~5 draws, so ~250 per depth
    train, _ = chain_split(1000, 0, seed=1, depth_lo=3, depth_hi=6)
    counts = Counter(chain_depth(p) for p in train)
    assert sorted(counts) == [3, 4, 5, 6]
    chi2 = sum((counts[d] - 250) ** 2 / 250 for d in counts)
    assert chi2 < 16.3, counts  # the 0.999 quantile of chi-square with 3 degrees of freedom
    # a shallow depth whose space fills up is under-represented, never repeated: depth 2 holds 729 problems
    train, _ = chain_split(3000, 0, seed=1, depth_lo=2, depth_hi=3)
    assert sum(chain_depth(p) == 2 for p in train) <= 729
    with pytest.raises(ValueError, match="depth_lo 4 > depth_hi 3"):
        chain_split(10, 0, seed=0, depth_lo=4, depth_hi=3)


@pytest.mark.parametrize("d", [2, 3, 4, 5, 6])
def test_thinking_length_bounds_by_depth(d):
    # by hand: d steps joined by d - 1 ';'. All ones: totals stay one digit, each step "t+1=u" is 5 characters;
    # all nines: "9+9=18" then d - 1 steps "t+9=u" of 7 characters (two-digit totals)
    assert thinking_len(chain_problem([1] * (d + 1))) == 5 * d + (d - 1)
    assert thinking_len(chain_problem([9] * (d + 1))) == 6 + 7 * (d - 1) + (d - 1)


def test_tiny_chain_budget_cuts_the_deep_problems():
    plan = build_plan("tiny_chain")
    lc, ro, dc = plan.exp.rollout.length, plan.exp.rollout, plan.exp.data
    train, val = chain_split(dc.n_train, dc.val_size, dc.seed, dc.chain_depth_lo, dc.chain_depth_hi)
    budgets = np.arange(lc.think_budget_lo, lc.think_budget_hi + 1)  # B ~ U[lo, hi], integers

    def cut_share(problems):  # P(thinking length > B), B uniform over the budgets
        lengths = np.array([thinking_len(p) for p in problems])
        return float(np.mean(lengths[:, None] > budgets[None, :]))

    by_depth = {d: [p for p in (*train, *val) if chain_depth(p) == d] for d in range(2, 7)}
    for d in (2, 3, 4):  # max thinking 8d - 2 <= 30 = think_budget_lo: never cut short
        assert 8 * d - 2 <= lc.think_budget_lo and cut_share(by_depth[d]) == 0.0
    assert cut_share(by_depth[6]) > 0.95  # 35..46 against 30..38
    assert 0.5 < cut_share(by_depth[5]) < 0.95  # 29..38: most of depth 5
    share = cut_share([*train, *val])
    assert 0.25 < share < 0.45, share  # about 35 % of the pool and validation set
    # the longest prompt fits the prompt budget; an interrupted completion fits max_new_tokens
    assert max(len(p.prompt) for p in (*train, *val)) <= ro.max_prompt_len
    assert lc.think_budget_hi + len(lc.interruption_text) + lc.answer_budget <= ro.max_new_tokens
    assert ro.max_prompt_len + ro.max_new_tokens == plan.seq_len <= plan.exp.model.max_seq_len
    # the warm start's rows hold the longest target: depth 6 of nines, prompt + solution + eos
    longest = chain_problem([9] * 7)
    assert len(longest.prompt) + len(longest.solution) + 1 <= plan.warm_seq_len <= plan.exp.model.max_seq_len
    # the length-penalty variant docks correct completions over L_max - L_cache tokens: depths 5 and 6 mostly
    free = lc.penalty_max_len - lc.penalty_cache
    over = np.mean([len(p.solution) + 1 > free for p in (*train, *val)])
    assert 0.3 < over < 0.5, over


def test_chain_is_scored_by_exact_match():
    p = chain_problem([3, 4, 5])
    completions = ["3+4=7;7+5=12#12", "3+4=7;7+5=12#12<eos><pad>", "3+4=7;7+5=11#11", "3+4=7;7+5=12", "#12.0"]
    rewards, counts = score(completions, [p] * len(completions))
    assert rewards.tolist() == [1.0, 1.0, -1.0, -1.0, -1.0]  # "12.0" would pass math-verify, not exact match
    assert counts["no_answer"] == 1


def test_data_config_and_from_config():
    dc = DataConfig(source="chain", n_train=40, val_size=12, seed=2, chain_depth_lo=3, chain_depth_hi=4)
    data = from_config(dc)
    assert len(data.train) == 40 and len(data.val) == 12
    assert {chain_depth(p) for p in (*data.train, *data.val)} <= {3, 4}
    assert [p.prompt_id for p in data.train] == [p.prompt_id for p in chain_split(40, 12, 2, 3, 4)[0]]
    with pytest.raises(ConfigError, match="n_train"):
        DataConfig(source="chain")
    with pytest.raises(ConfigError, match="chain_depth_lo/hi"):
        DataConfig(source="chain", n_train=10, chain_depth_lo=5, chain_depth_hi=4)


def test_tiny_chain_preset_prints_its_config(capsys):
    from scalerl_jax.experiments.math_8b import main

    plan = build_plan("tiny_chain")
    assert plan.base_kind == "char_chain" and plan.exp.data.source == "chain"
    ro, dc = plan.exp.rollout, plan.exp.data
    assert dc.n_train // ro.prompts_per_batch <= 4  # a small pool: an epoch every few steps
    assert plan.exp.train.steps * ro.prompts_per_batch >= 8 * dc.n_train  # revisited over several epochs
    assert main(["--preset", "tiny_chain", "--set", "data.chain_depth_hi=5", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["data"]["source"] == "chain" and cfg["data"]["chain_depth_hi"] == 5
