"""Tokenizers: fixed character vocabulary, round trips, clear errors, HF tokenizer.json loading."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models, pre_tokenizers

from scalerl_jax.data import CharTokenizer, HFTokenizer, Tokenizer, TokenizerError, arith_problems


def test_char_vocab_is_fixed():
    tok = CharTokenizer()
    assert tok.vocab_size == 17
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, None)
    expected = {"0": 2, "1": 3, "2": 4, "3": 5, "4": 6, "5": 7, "6": 8, "7": 9, "8": 10, "9": 11,
                "+": 12, "*": 13, "=": 14, ";": 15, "#": 16}  # fmt: skip
    for ch, i in expected.items():
        assert tok.encode(ch) == [i]
    assert isinstance(tok, Tokenizer)


def test_char_round_trip_on_task_text():
    tok = CharTokenizer()
    for p in arith_problems(200, seed=1):
        for text in (p.prompt, p.solution, p.prompt + p.solution):
            ids = tok.encode(text)
            assert len(ids) == len(text)
            assert tok.decode(ids) == text


def test_char_decode_special_tokens():
    tok = CharTokenizer()
    ids = tok.encode("1+2*3=") + [1, 0, 0]
    assert tok.decode(ids) == "1+2*3="
    assert tok.decode(ids, skip_special_tokens=False) == "1+2*3=<eos><pad><pad>"


def test_char_unknown_character_error_names_char_and_position():
    tok = CharTokenizer()
    with pytest.raises(TokenizerError, match=r"'x' at position 3"):
        tok.encode("12+x")
    with pytest.raises(TokenizerError, match=r"id 17 at position 1"):
        tok.decode([2, 17])


def _build_hf_dir(tmp_path, with_configs=True):
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "hello": 4, "world": 5, "the": 6, "answer": 7, "is": 8,
             "42": 9, "<|eot|>": 10}  # fmt: skip
    raw = RawTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.add_special_tokens(["<pad>", "<s>", "</s>", "<|eot|>"])
    raw.save(str(tmp_path / "tokenizer.json"))
    if with_configs:
        (tmp_path / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": "<pad>"})
        )
        (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [2, 10], "bos_token_id": 1}))
    return vocab


def test_hf_tokenizer_from_dir(tmp_path):
    vocab = _build_hf_dir(tmp_path)
    tok = HFTokenizer(str(tmp_path))
    assert isinstance(tok, Tokenizer)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    assert tok.stop_ids == (2, 10)
    assert tok.vocab_size == len(vocab)
    words = ["hello", "world", "the", "answer", "is", "42"]
    ids = tok.encode(" ".join(words))
    assert ids == [vocab[w] for w in words]
    assert tok.decode(ids) == "hello world the answer is 42"
    assert tok.decode([1, *ids, 2, 0, 0]) == "hello world the answer is 42"


def test_hf_tokenizer_from_file_needs_eos(tmp_path):
    _build_hf_dir(tmp_path, with_configs=False)
    with pytest.raises(TokenizerError, match="eos"):
        HFTokenizer(str(tmp_path / "tokenizer.json"))
    tok = HFTokenizer(str(tmp_path / "tokenizer.json"), eos_id=2)
    assert (tok.eos_id, tok.pad_id, tok.bos_id) == (2, 2, None)  # pad falls back to eos
    with pytest.raises(FileNotFoundError):
        HFTokenizer(str(tmp_path / "missing"))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="0123456789+*=;#", max_size=40))
def test_char_round_trip_property(text):
    tok = CharTokenizer()
    ids = tok.encode(text)
    assert all(2 <= i < 17 for i in ids)
    assert tok.decode(ids) == text
