"""Tokenizer directories the presets write: loadable by transformers with the same ids, exact round trips, and chat
templates rendered as transformers renders them."""

import pytest
from transformers import AutoTokenizer

from scalerl_jax.data.tokenizer import CHAR_SYMBOLS, CharTokenizer, HFTokenizer, TokenizerError
from scalerl_jax.data.tokenizer_build import (
    SIMPLE_CHAT_TEMPLATE,
    copy_tokenizer_files,
    save_char_tokenizer,
    train_bpe_tokenizer,
)
from scalerl_jax.data.word_arith import box_the_product, corpus, word_arith_rows

SMALL_TEMPLATE = "{question} Put the answer in \\boxed{}."
# a Llama-3-instruct style template (the shape real checkpoints ship), rendered by both implementations
LLAMA3_STYLE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    return save_char_tokenizer(tmp_path_factory.mktemp("char"))


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    rows = word_arith_rows(2000, seed=0)
    d = train_bpe_tokenizer(corpus(rows, SMALL_TEMPLATE), tmp_path_factory.mktemp("bpe"), vocab_size=400)
    return d, rows


def test_char_tokenizer_json_has_the_char_ids(char_dir):
    ref, hf = CharTokenizer(), HFTokenizer(str(char_dir))
    text = "7+12*3=12*3=36;7+36=43#43" + CHAR_SYMBOLS
    assert hf.encode(text) == ref.encode(text)
    assert (hf.vocab_size, hf.pad_id, hf.eos_id, hf.bos_id, hf.stop_ids) == (17, 0, 1, None, (1,))
    ids = ref.encode(text) + [1, 0, 0]
    assert hf.decode(ids) == ref.decode(ids) == text
    at = AutoTokenizer.from_pretrained(str(char_dir))
    assert at(text, add_special_tokens=False).input_ids == ref.encode(text)
    assert (at.eos_token_id, at.pad_token_id) == (1, 0)
    with pytest.raises(Exception, match="UNK|unk|Missing"):  # an unknown character is an error, never <unk>
        hf.encode("7a")


def test_bpe_round_trips_and_matches_transformers(bpe):
    d, rows = bpe
    tok = HFTokenizer(str(d))
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2) and tok.vocab_size <= 400
    at = AutoTokenizer.from_pretrained(str(d))
    texts = corpus(rows[:50], SMALL_TEMPLATE) + ["Unseen wörds, émojis 🙂 and 1234567 digits\n\ttabs"]
    for t in texts:
        ids = tok.encode(t)
        assert tok.decode(ids) == t  # byte-level: exact for any string
        assert at(t, add_special_tokens=False).input_ids == ids
    # digits are single tokens, so numbers stay learnable one digit at a time
    for digit in "0123456789":
        assert len(tok.encode(digit)) == 1
    assert len(tok.encode("693")) == 3
    assert tok.decode([tok.bos_id, *tok.encode("A shop"), tok.eos_id, tok.pad_id]) == "A shop"


def test_box_the_product_commits_to_the_wrong_number():
    from scalerl_jax.data.jsonl import last_boxed

    for row in word_arith_rows(50, seed=3, b_max=19):
        cut = box_the_product(row["answer"])
        b, c = (int(v) for v in cut.split("=", 1)[0].split("*"))
        assert last_boxed(cut) == str(b * c)  # by hand: the product, not a + b * c
        assert cut.rsplit("\\boxed", 1)[0] == row["answer"].rsplit("\\boxed", 1)[0]  # every step kept


@pytest.mark.parametrize("template", [SIMPLE_CHAT_TEMPLATE, LLAMA3_STYLE])
def test_chat_template_renders_as_transformers_does(bpe, tmp_path, template):
    import json

    d, _ = bpe
    copy_tokenizer_files(d, tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (tmp_path / "tokenizer_config.json").unlink()  # a hard link to the fixture's file: do not write through it
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    ours = HFTokenizer(str(tmp_path))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path))
    for messages in ([{"role": "user", "content": "What is 2+3*4?"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " 7 apples "}]):
        for gen in (True, False):
            assert ours.apply_chat_template(messages, add_generation_prompt=gen) == theirs.apply_chat_template(
                messages, add_generation_prompt=gen, tokenize=False)


def test_no_chat_template_is_a_clear_error(char_dir):
    with pytest.raises(TokenizerError, match="no chat template"):
        HFTokenizer(str(char_dir)).apply_chat_template([{"role": "user", "content": "1+2*3="}])
