"""Length budgets (experiments/budgets.py): the training row is max_prompt_len + max_new_tokens on every preset,
``rollout.max_prompt_len=auto`` is measured from the data, a budget that does not fit names the flag and by how much,
every bad data/rollout value stops the run with status 2 before any metrics exist, and the think_end watch.

The user's case end to end: a random transformers Llama with its own BPE tokenizer, the 64 shortest GSM8K questions
under the default template, ``--preset small --model DIR --data FILE --generators 2``."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from scalerl_jax.experiments import budgets
from scalerl_jax.experiments.math_8b import main
from scalerl_jax.experiments.presets import MOE_PRESETS, PRESETS, build_plan

from scalerl_jax.config import (
    DEFAULT_PROMPT_TEMPLATE,
    PLAIN_INTERRUPTION,
    PLAIN_THINK_END,
    THINK_INTERRUPTION,
    ConfigError,
    DataConfig,
    RolloutConfig,
)
from scalerl_jax.rollout.orchestrator import RolloutBatch
from scalerl_jax.rollout.protocol import Completion
from tests.conftest import HANG_S

R = dataclasses.replace
ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT / "data" / "gsm8k_test.jsonl"
N_ROWS = 64


# ---- the row length is the sum of the budgets, on every preset ---------------------------------------------


def test_row_length_is_prompt_plus_completion_on_every_preset():
    # the row lengths every preset had when they were written by hand: only tiny_chain's (64) was larger than its
    # budgets (16 + 44); its warm start keeps 64 (the longest depth-6 chain is 14 + 49 + eos)
    before = {"tiny": 40, "smoke": 40, "small": 68, "tiny_mathcode": 51, "tiny_chain": 64, "1b": 5120, "8b": 16384,
              "tiny_moe": 40, "smoke_moe": 40, "scout": 16384, "qwen25_1_5b": 5120, "qwen3_4b": 16384, "gpu_rl": 40,
              "qwen3_30b_a3b": 16384}
    for name in (*PRESETS, *MOE_PRESETS):
        plan = build_plan(name)
        ro = plan.exp.rollout
        assert plan.seq_len == ro.max_prompt_len + ro.max_new_tokens <= plan.exp.model.max_seq_len, name
        assert plan.seq_len == before[name] or name == "tiny_chain", name
        if plan.warm_steps:
            assert plan.warm_seq_len == before[name], name  # warm starts (and their cache keys) did not move
    assert build_plan("tiny_chain").seq_len == 60
    with pytest.raises(TypeError):  # no separate row length to set
        R(build_plan("small"), seq_len=100)
    auto = build_plan("small")
    auto = R(auto, exp=R(auto.exp, rollout=R(auto.exp.rollout, max_prompt_len="auto")))
    with pytest.raises(ConfigError, match="auto has no value before the data is measured"):
        auto.seq_len


def test_budget_over_the_model_names_the_flags_and_the_excess():
    exp = build_plan("small").exp  # model.max_seq_len 128
    over = R(exp, rollout=R(exp.rollout, max_prompt_len=100, max_new_tokens=48))
    with pytest.raises(ConfigError, match=r"100 \+ rollout.max_new_tokens 48 = 148 .* context of 128 .*"
                                          r"--rollout.max-prompt-len or --rollout.max-new-tokens by 20"):
        budgets.check_row_fits_model(over)
    budgets.check_row_fits_model(R(exp, rollout=R(exp.rollout, max_prompt_len=80, max_new_tokens=48)))  # 128: fits
    with pytest.raises(ConfigError, match="leaves no room for a prompt .* by at least 1"):
        budgets.check_row_fits_model(R(exp, rollout=R(exp.rollout, max_prompt_len="auto", max_new_tokens=128)))
    # small: think_budget_hi 26 + answer 8 = 34 (+ the interruption text's tokens with a tokenizer)
    short = R(exp, rollout=R(exp.rollout, max_new_tokens=30))
    with pytest.raises(ConfigError, match=r"--rollout.max-new-tokens by 4 \(to 34\)"):
        budgets.check_completion_budget(short)
    with pytest.raises(ConfigError, match=r"the interruption text's 3 tokens .* = 37: raise --rollout.max-new-tokens "
                                          r"by 1 \(to 37\)"):
        budgets.check_completion_budget(R(exp, rollout=R(exp.rollout, max_new_tokens=36)), 3)


def test_auto_prompt_budget_rule():
    exp = build_plan("small").exp  # max_seq_len 128
    auto = R(exp, rollout=R(exp.rollout, max_prompt_len="auto", max_new_tokens=48))
    assert budgets.resolve_prompt_budget(auto, [44, 56, 50]) == (56, "auto: the longest prompt")
    budget, rule = budgets.resolve_prompt_budget(auto, [44, 81, 50])  # 81 > 128 - 48: capped, the 81 is dropped
    assert budget == 80 and "capped" in rule
    assert budgets.resolve_prompt_budget(R(auto, rollout=R(auto.rollout, max_prompt_len=64)), [99]) == (64, "set")


def test_unusable_data_is_refused_with_counts_and_the_needed_budget():
    exp = build_plan("small").exp
    exp = R(exp, rollout=R(exp.rollout, max_prompt_len=32, max_new_tokens=48))
    train, val = [44, 47, 56, 50], [45, 52]
    # one of each needs max(min(train), min(val)) = max(44, 45) = 45 tokens: 13 more than 32
    with pytest.raises(ConfigError, match=r"0 of 4 training and 0 of 2 validation prompts of f.jsonl fit "
                                          r"rollout.max_prompt_len = 32 tokens \(prompts run 44-56 .*\): raise "
                                          r"--rollout.max-prompt-len by 13 \(to 45\)"):
        budgets.check_usable(exp, 32, train, val, "f.jsonl")
    with pytest.raises(ConfigError, match=r"1 of 4 training and 0 of 2 validation .* by 1 \(to 45\)"):
        budgets.check_usable(exp, 44, train, val, "f.jsonl")
    budgets.check_usable(exp, 45, train, val, "f.jsonl")  # one of each fits
    # one of each needs max(90, 95) = 95 tokens, but the model's context leaves 128 - 48 = 80 beside the completion
    with pytest.raises(ConfigError, match="a 95-token prompt needs --rollout.max-new-tokens lowered by 15"):
        budgets.check_usable(exp, 32, [90], [95], "f.jsonl")


def test_bad_config_values_name_the_field():
    cases = [(lambda: DataConfig(template="no placeholder"), "data.template must contain '{question}'"),
             (lambda: DataConfig(code_template="x"), "data.code_template must contain"),
             (lambda: DataConfig(val_size=0), "data.val_size must be >= 1"),
             (lambda: DataConfig(n_train=0), "data.n_train must be >= 1"),
             (lambda: DataConfig(question_key=" "), "data.question_key must be a field name"),
             (lambda: DataConfig(npr_threshold=0.0), r"data.npr_threshold must be in \(0, 1\]"),
             (lambda: RolloutConfig(max_prompt_len=0), "rollout.max_prompt_len must be a number of tokens >= 1 or "
                                                       "'auto'"),
             (lambda: RolloutConfig(max_prompt_len="long"), "rollout.max_prompt_len"),
             (lambda: RolloutConfig(max_new_tokens=0), "rollout.max_new_tokens must be >= 1"),
             (lambda: RolloutConfig(prompts_per_batch=0), "rollout.prompts_per_batch must be >= 1")]
    for make, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            make()


# ---- markers: think_end="auto" and the watch ---------------------------------------------------------------


class _Tok:
    """A tokenizer over whitespace-free pieces: "</think>" is one token only when ``think_token``."""

    def __init__(self, think_token: bool):
        self.think_token = think_token

    def encode(self, text: str) -> list[int]:
        if self.think_token and text == "</think>":
            return [7]
        return [ord(c) for c in text]


def test_think_end_auto_follows_the_tokenizer():
    plan = build_plan("8b")
    assert plan.exp.rollout.length.think_end == "auto"  # the real presets do not assume <think>
    assert build_plan("1b").exp.rollout.length.think_end == "auto"
    lc = budgets.resolve_markers(plan.exp, _Tok(True), log=lambda s: None).rollout.length
    assert (lc.think_end, lc.interruption_text) == ("</think>", THINK_INTERRUPTION)
    lc = budgets.resolve_markers(plan.exp, _Tok(False), log=lambda s: None).rollout.length
    assert (lc.think_end, lc.interruption_text) == (PLAIN_THINK_END, PLAIN_INTERRUPTION)
    assert "\\boxed{}" in DEFAULT_PROMPT_TEMPLATE  # the plain pair is for a template that asks for a boxed answer
    small = build_plan("small").exp  # explicit markers are kept
    assert budgets.resolve_markers(small, _Tok(True), log=lambda s: None) == small


def _completion(tokens: list[int], injected_at: int | None = None) -> Completion:
    n = len(tokens)
    inj = [injected_at is not None and i >= injected_at for i in range(n)]
    return Completion(request_id="0", sample_index=0, prompt_ids=[1], token_ids=tokens, logprobs=[0.0] * n,
                      versions=[0] * n, injected=inj, finish_reason="stop")


def test_think_end_watch_counts_only_what_the_model_wrote():
    decode = lambda ids: "".join(chr(i) for i in ids)  # noqa: E731
    enc = lambda s: [ord(c) for c in s]  # noqa: E731

    def batch(*groups):
        return RolloutBatch(0, [], [list(g) for g in groups], [], 0.0, 0)

    rows, logs = [], []

    class W:
        write = rows.append

    # the only "</think>" is in the injected interruption text: nothing counts, the watch warns after 2 batches
    watch = budgets.ThinkEndWatch("</think>", decode, batches=2, log=logs.append)
    watch.metrics = W()
    cut = _completion(enc("abc" + "time is up </think>") + enc("42"), injected_at=3)
    watch(0, batch([cut, _completion(enc("no marker"))]), None, None)
    assert rows == []
    watch(1, batch([cut]), None, None)
    assert rows == [{"kind": "length_check", "step": 1, "think_end": "</think>", "samples": 3,
                     "think_end_written": 0, "interrupted": 2, "warning": rows[0]["warning"]}]
    assert "rollout.length.think_end" in rows[0]["warning"] and logs and "warning" in logs[0]
    watch(2, batch([cut]), None, None)  # later batches are not looked at
    assert len(rows) == 1
    # one sample that closes its own thinking: no warning
    rows.clear()
    ok = budgets.ThinkEndWatch("</think>", decode, batches=1, log=logs.append)
    ok.metrics = W()
    ok(0, batch([_completion(enc("hmm</think>42")), cut]), None, None)
    assert rows[0]["think_end_written"] == 1 and "warning" not in rows[0]


# ---- the user's case, end to end (subprocesses of the command line) --------------------------------------


@pytest.fixture(scope="module")
def user_base(tmp_path_factory):
    """A random transformers LlamaForCausalLM with a byte-level BPE trained on GSM8K text, and the 64 shortest GSM8K
    questions as jsonl."""
    from scalerl_jax.data.tokenizer_build import train_bpe_tokenizer
    from tests.hf_models import make_hf_llama

    d = tmp_path_factory.mktemp("user")
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines() if line.strip()]
    model_dir = train_bpe_tokenizer([DEFAULT_PROMPT_TEMPLATE.replace("{question}", r["question"]) + r["answer"]
                                     for r in rows], d / "model", vocab_size=800)
    from scalerl_jax.data.tokenizer import HFTokenizer

    tok = HFTokenizer(str(model_dir))
    make_hf_llama(model_dir, vocab=tok.vocab_size, hidden=32, layers=2, heads=2, kv_heads=1, ffn=64)
    short = sorted(rows, key=lambda r: len(r["question"]))[:N_ROWS]
    data = d / "gsm8k_short.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in short))
    lengths = sorted(1 + len(tok.encode(DEFAULT_PROMPT_TEMPLATE.replace("{question}", r["question"]))) for r in short)
    return model_dir, data, lengths


#: the default template (not the small preset's shorter one): prompts of 47-90 tokens with this tokenizer
TEMPLATE = ["--data.template", DEFAULT_PROMPT_TEMPLATE]
FAST = [*TEMPLATE, "--steps", "2", "--no-fit", "--generators", "2", "--set", "data.val_size=4", "--set",
        "rollout.prompts_per_batch=4", "--set", "rollout.group_size=2", "--set", "train.eval_every=100",
        "--set", "train.eval_samples=1", "--set", "train.checkpoint_every=100",
        # a random model solves nothing: keep the all-wrong groups so that each batch makes an update
        "--set", "loss.filter_zero_variance=false"]


def _run_cli(model_dir, data, out, *extra, timeout=HANG_S):
    return subprocess.run([sys.executable, "-m", "experiments.math_8b", "--preset", "small", "--model", str(model_dir),
                           "--data", str(data), "--out", str(out), *FAST, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _rows(out, kind):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.mark.heavy
@pytest.mark.slow  # about 90 s each on a loaded 2-core CPU: two servers and a router start per run
@pytest.mark.parametrize("budget", ["64", "auto"])
def test_user_model_and_gsm8k_run_on_the_small_preset(user_base, tmp_path, budget):
    model_dir, data, lengths = user_base
    assert 32 < lengths[0] < 64 < lengths[-1], lengths  # the preset's own 32 drops every prompt, 64 some
    r = _run_cli(model_dir, data, tmp_path / "run", "--set", f"rollout.max_prompt_len={budget}",
                 "--set", "rollout.max_new_tokens=48")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "run"
    (row,) = _rows(out, "data")
    # auto: the longest templated prompt (+ bos), under the model's 256 - 48; nothing dropped
    want = lengths[-1] if budget == "auto" else 64
    assert (row["max_prompt_len"], row["seq_len"], row["longest_prompt"]) == (want, want + 48, lengths[-1])
    dropped = sum(n > want for n in lengths)  # counted independently: the fixture's own tokenisation
    assert row["dropped_long_prompts_train"] + row["dropped_long_prompts_val"] == dropped
    assert (dropped > 0) == (budget != "auto")
    assert row["n_train"] + row["n_val"] == N_ROWS - dropped and 1 <= row["n_val"] <= 4
    assert row["max_prompt_len_rule"] == ("auto: the longest prompt" if budget == "auto" else "set")
    assert len(_rows(out, "train")) == 2
    # the small preset's " \boxed" marker is never written by a random model: the watch says so after 2 batches
    (check,) = _rows(out, "length_check")
    assert check["think_end_written"] == 0 and "warning" in check and "[length] warning" in r.stdout
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rollout"]["max_prompt_len"] == want and cfg["max_prompt_len_asked"] == (
        "auto" if budget == "auto" else 64)
    summary = json.loads((out / "summary.json").read_text())["run"]
    assert summary["prompt_budget"]["max_prompt_len"] == want and summary["seq_len"] == want + 48
    report = " ".join((out / "report.md").read_text().split())
    assert f"prompt budget {want} tokens" in report and f"training rows of {want + 48} tokens" in report
    assert ("rollout.max_prompt_len=auto: the longest prompt" in report) == (budget == "auto")


def test_refused_inputs_exit_2_naming_the_field_without_metrics(user_base, tmp_path, capsys):
    """Each refusal comes before any compute (no warm start, no server, no metrics.jsonl)."""
    model_dir, data, lengths = user_base
    keyless = tmp_path / "keyless.jsonl"
    keyless.write_text("".join(json.dumps({"q": f"{i}+1?", "a": str(i + 1)}) + "\n" for i in range(8)))
    cases = [
        (["--data", str(data)], "rollout.max_prompt_len = 32 tokens"),  # the preset's own budget: all dropped
        (["--data", str(data), "--set", "rollout.max_prompt_len=64", "--set", "rollout.max_new_tokens=30"],
         "raise --rollout.max-new-tokens by"),
        (["--data", str(data), "--set", "rollout.max_prompt_len=64", "--set", "rollout.max_new_tokens=300"],
         "exceeds the model's context of 256 tokens"),
        (["--data", str(data), "--set", f"data.val_size={N_ROWS}"], f"data.val_size {N_ROWS} holds out every one"),
        (["--data", str(data), "--data.template", "Solve it."], "data.template must contain '{question}'"),
        (["--data", str(keyless)], "set data.question_key"),
        (["--data", str(keyless), "--set", "data.skip_malformed=true"], "no usable rows"),
    ]
    for args, needle in cases:
        out = tmp_path / "out"
        # data.val_size=4: the preset's 200 would hold out all 64 rows (a case below)
        argv = ["--preset", "small", "--model", str(model_dir), "--out", str(out), "--no-fit",
                *TEMPLATE, "--set", "data.val_size=4", *args]
        try:
            rc = main(argv)
        except SystemExit as e:  # the command line's own refusals (tyro, cli_error)
            rc = e.code
        err = capsys.readouterr()
        text = err.out + err.err
        assert rc == 2 and needle in " ".join(text.split()), (args, text[-2000:])
        assert "Traceback" not in text
        assert not (out / "metrics.jsonl").exists()
    # the message for the all-dropped case says by how much: the budget that keeps one training and one validation
    # prompt is at most the longest prompt; 32 + that gap <= the longest
    rc = main(["--preset", "small", "--model", str(model_dir), "--out", str(tmp_path / "o2"), "--data", str(data),
               *TEMPLATE, "--set", "data.val_size=4"])
    msg = capsys.readouterr().err
    gap = int(msg.split("raise --rollout.max-prompt-len by ")[1].split()[0])
    assert rc == 2 and lengths[0] <= 32 + gap <= lengths[-1]

