"""The run path's inputs: the model directory, jsonl data and server URLs are checked before compute, the architecture
comes from the checkpoint and the numerics from the preset, and prompts over the budget are dropped and counted."""

import dataclasses
import json
import subprocess
import sys

import jax
import pytest
from scalerl_jax.experiments.base_models import check_model_dir
from scalerl_jax.experiments.budgets import settle
from scalerl_jax.experiments.numerics import model_from_checkpoint
from scalerl_jax.experiments.presets import build_plan
from scalerl_jax.experiments.run_path import check_inputs, load_prompts

from scalerl_jax.config import ConfigError
from scalerl_jax.data.tokenizer import HFTokenizer
from scalerl_jax.data.tokenizer_build import save_char_tokenizer, train_bpe_tokenizer
from scalerl_jax.models import init_params, load_hf_checkpoint, save_hf_checkpoint, tiny
from tests.conftest import DATA, HANG_S, ROOT
from tests.servers import free_port

R = dataclasses.replace


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_base")
    save_hf_checkpoint(init_params(tiny(), jax.random.PRNGKey(0)), tiny(), d)
    save_char_tokenizer(d)
    return d


def test_tiny_architecture_round_trips_through_its_checkpoint(tiny_dir):
    """The tiny preset's RL run reads its model back from the warm start's config.json: nothing may change."""
    _, ckpt = load_hf_checkpoint(tiny_dir)
    assert model_from_checkpoint(tiny(), ckpt) == tiny()


def test_architecture_from_the_checkpoint_numerics_from_the_preset(tiny_dir):
    preset = R(build_plan("8b").exp.model, head_dtype="bfloat16")  # e.g. the bf16_head variant of the 8B recipe
    _, ckpt = load_hf_checkpoint(tiny_dir)
    m = model_from_checkpoint(preset, ckpt)
    assert (m.vocab_size, m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.ffn_dim, m.max_seq_len) == (
        17, 128, 4, 4, 2, 512, 64)  # tiny's shapes (presets.tiny), read from its config.json
    assert (m.dtype, m.head_dtype, m.remat, m.attn_chunk) == ("bfloat16", "bfloat16", True, 1024)  # the 8B recipe's


def test_model_dir_errors_name_what_is_missing(tiny_dir, tmp_path):
    assert check_model_dir(tiny_dir) == tiny_dir
    with pytest.raises(ConfigError, match="not a directory"):
        check_model_dir(tmp_path / "nope")
    no_tok = tmp_path / "no_tok"
    save_hf_checkpoint(init_params(tiny(), jax.random.PRNGKey(0)), tiny(), no_tok)
    with pytest.raises(ConfigError, match=f"{no_tok}: no tokenizer.json"):
        check_model_dir(no_tok)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        check_model_dir(tmp_path / "empty")


def _plan(tmp_path, **data):
    plan = build_plan("small")
    exp = plan.exp
    return R(plan, exp=R(exp, out_dir=str(tmp_path / "run"), data=R(exp.data, **data),
                         rollout=R(exp.rollout, local_servers=0, engine="embedded", max_prompt_len=96)))


def test_bad_jsonl_row_is_named_before_compute(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?"}\n{"question": "3+3?", "answer": "6"}\n')
    with pytest.raises(ConfigError, match=f"{bad}:2: no answer field"):
        check_inputs(_plan(tmp_path, path=str(bad)))
    # skipping is opt-in and then fine (2 rows: one to hold out, one to train on)
    check_inputs(_plan(tmp_path, path=str(bad), skip_malformed=True, val_size=1))


def test_unreachable_url_is_named_before_compute(tmp_path):
    plan = _plan(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    plan = R(plan, exp=R(plan.exp, rollout=R(plan.exp.rollout, engine="sglang", sglang_urls=(url,))))
    with pytest.raises(ConfigError, match=f"--sglang-urls {url}: unreachable"):
        check_inputs(plan)


def test_cli_stops_on_bad_inputs_before_any_compute(tiny_dir, tmp_path):
    """Each bad input exits with status 2 and a message naming it, without warm start or server start-up."""
    no_tok = tmp_path / "no_tok"
    save_hf_checkpoint(init_params(tiny(), jax.random.PRNGKey(0)), tiny(), no_tok)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "2+2?"}\n')
    dead = f"http://127.0.0.1:{free_port()}"
    cases = [(["--model", str(no_tok)], f"{no_tok}: no tokenizer.json"),
             (["--model", str(tiny_dir), "--data", str(bad)], f"{bad}:1: no answer field"),
             (["--model", str(tiny_dir), "--data", str(DATA / "gsm8k_test.jsonl"), "--sglang-urls", dead],
              f"{dead}: unreachable")]
    for args, needle in cases:
        r = subprocess.run([sys.executable, "-m", "experiments.math_8b", "--preset", "small", *args, "--out",
                            str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stdout[-2000:], r.stderr[-2000:])
        assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_long_prompts_are_dropped_and_counted(tmp_path):
    rows = [{"problem": "Compute " + "1+" * n + "1.", "answer": str(n + 1)} for n in range(40)]  # Polaris layout
    path = tmp_path / "polaris_like.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok_dir = train_bpe_tokenizer([r["problem"] for r in rows], tmp_path / "tok", vocab_size=300)
    tok = HFTokenizer(str(tok_dir))
    plan = _plan(tmp_path, path=str(path), template="{question}", val_size=10, seed=0)
    budget = 30
    # settle checks every length: room for this tokenizer's 7-token interruption text in the completion
    exp = R(plan.exp, rollout=R(plan.exp.rollout, max_prompt_len=budget, max_new_tokens=48))
    settled = settle(exp, tok, load_prompts(exp, tok), log=lambda s: None)
    data, dropped = settled.data, settled.dropped
    # independent count: transformers' tokenizer over the same directory, plus the bos the producer prepends
    from transformers import AutoTokenizer

    at = AutoTokenizer.from_pretrained(str(tok_dir))
    expect_long = {r["problem"] for r in rows if 1 + len(at(r["problem"], add_special_tokens=False).input_ids) > budget}
    assert expect_long and len(expect_long) < len(rows)
    assert dropped["train"] + dropped["val"] == len(expect_long)
    kept = {p.prompt for p in data.train + data.val}
    assert kept.isdisjoint(expect_long) and len(kept) == len(rows) - len(expect_long)
    assert all(p.answer == str(p.prompt.count("1+") + 1) for p in data.train)  # Polaris 'problem'/'answer' fields


def test_chat_template_prompts(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(20)))
    tok = HFTokenizer(str(train_bpe_tokenizer(["What is 1+1?"] * 10, tmp_path / "tok", vocab_size=280)))
    plan = _plan(tmp_path, path=str(path), template="Q: {question}", chat_template=True, val_size=5)
    data = load_prompts(plan.exp, tok)
    p = data.train[0]
    q = p.prompt.split("Q: ", 1)[1].split("<|eos|>")[0]
    assert p.prompt == f"<|bos|><|user|>\nQ: {q}<|eos|>\n<|assistant|>\n"  # SIMPLE_CHAT_TEMPLATE, by hand
    assert tok.encode(p.prompt)[0] == tok.bos_id  # the template wrote the bos: the producer must not add another
    from scalerl_jax.rollout.orchestrator import RolloutProducer
    from scalerl_jax.rollout.protocol import SamplingParams
    from scalerl_jax.train.warmstart import sft_arrays

    prod = RolloutProducer(None, None, encode=tok.encode, decode=tok.decode, score=None, sampling=SamplingParams(),
                           prompts_per_batch=1, bos_id=tok.bos_id)
    ids = prod.requests_for([p])[0].prompt_ids
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id
    tokens, mask = sft_arrays([p], tok.encode, tok.eos_id, tok.pad_id, 96, bos_id=tok.bos_id)
    assert list(tokens[0]).count(tok.bos_id) == 1 and tokens[0][0] == tok.bos_id
    # and the plain template gets exactly one bos prepended
    plain = R(plan, exp=R(plan.exp, data=R(plan.exp.data, chat_template=False)))
    q_plain = load_prompts(plain.exp, tok)
    ids = prod.requests_for([q_plain.train[0]])[0].prompt_ids
    assert ids[0] == tok.bos_id and ids[1:] == tok.encode(q_plain.train[0].prompt)
